-- Population-based training: every exploit and its explore, in order.
-- The receiver takes the donor's state at step `step` (its report count)
-- and iteration `iteration`, and continues with `new_params` (a typed
-- JSON object, as salus_trial_summary's params) instead of `old_params`.
CREATE TABLE salus_pbt_events (
    pbt_event_id BIGSERIAL NOT NULL PRIMARY KEY,
    study_id INTEGER NOT NULL REFERENCES studies (study_id),
    trial_id INTEGER NOT NULL REFERENCES trials (trial_id),
    donor_trial_id INTEGER NOT NULL REFERENCES trials (trial_id),
    generation INTEGER NOT NULL,
    step INTEGER NOT NULL,
    iteration INTEGER NOT NULL,
    old_params TEXT NOT NULL,
    new_params TEXT NOT NULL,
    resampled TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    seconds DOUBLE PRECISION NOT NULL,
    on_device BOOLEAN NOT NULL,
    time TIMESTAMP WITHOUT TIME ZONE NOT NULL
);
CREATE INDEX ix_salus_pbt_events_study ON salus_pbt_events (study_id, pbt_event_id);
CREATE INDEX ix_salus_pbt_events_trial ON salus_pbt_events (trial_id);

-- Each exploit with both trials by number: who copied whom, when, and what
-- changed.
CREATE VIEW salus_pbt_lineage AS
SELECT s.study_name, e.study_id, e.generation, e.step, e.iteration,
       r.number AS trial_number, d.number AS donor_number,
       e.old_params, e.new_params, e.resampled, e.bytes, e.seconds, e.on_device, e.time
FROM salus_pbt_events e
JOIN studies s ON s.study_id = e.study_id
JOIN trials r ON r.trial_id = e.trial_id
JOIN trials d ON d.trial_id = e.donor_trial_id;
