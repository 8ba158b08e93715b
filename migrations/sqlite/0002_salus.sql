-- salus-tune's own tables: what Optuna's schema has no place for.
-- Optuna ignores tables it does not know, so its tools still read the file.

-- One row per trial: where it ran, what it needed, how far it got.
CREATE TABLE salus_trials (
    trial_id INTEGER NOT NULL PRIMARY KEY REFERENCES trials (trial_id),
    device TEXT NOT NULL,
    lane INTEGER,
    persistent_bytes INTEGER NOT NULL DEFAULT 0,
    ephemeral_bytes INTEGER NOT NULL DEFAULT 0,
    shared_bytes INTEGER NOT NULL DEFAULT 0,
    iterations INTEGER NOT NULL DEFAULT 0,
    total_iterations INTEGER NOT NULL DEFAULT 0,
    device_seconds REAL NOT NULL DEFAULT 0,
    fail_reason TEXT
);

-- Everything that happened, in order: study_start, trial_start, report,
-- trial_complete, trial_fail, trial_requeue, study_stop. detail is JSON.
CREATE TABLE salus_events (
    event_id INTEGER NOT NULL PRIMARY KEY,
    study_id INTEGER NOT NULL REFERENCES studies (study_id),
    trial_id INTEGER REFERENCES trials (trial_id),
    time DATETIME NOT NULL,
    kind VARCHAR(32) NOT NULL,
    lane INTEGER,
    detail TEXT
);
CREATE INDEX ix_salus_events_study ON salus_events (study_id, event_id);
CREATE INDEX ix_salus_events_trial ON salus_events (trial_id);

-- Parameters with categoricals decoded to their chosen value.
CREATE VIEW salus_params AS
SELECT s.study_name, t.study_id, t.trial_id, t.number, p.param_name,
       CASE WHEN json_extract(p.distribution_json, '$.name') = 'CategoricalDistribution'
            THEN json_extract(p.distribution_json, '$.attributes.choices[' || CAST(p.param_value AS INTEGER) || ']')
            ELSE p.param_value END AS value,
       p.param_value AS internal_value
FROM trial_params p
JOIN trials t ON t.trial_id = p.trial_id
JOIN studies s ON s.study_id = t.study_id;

-- One row per trial: state, value, parameters as a JSON object, timing.
CREATE VIEW salus_trial_summary AS
SELECT s.study_name, t.study_id, t.trial_id, t.number, t.state, v.value,
       (SELECT json_group_object(sp.param_name, sp.value) FROM salus_params sp WHERE sp.trial_id = t.trial_id) AS params,
       t.datetime_start, t.datetime_complete,
       (julianday(t.datetime_complete) - julianday(t.datetime_start)) * 86400.0 AS duration_s,
       st.device, st.iterations, st.device_seconds, st.fail_reason
FROM trials t
JOIN studies s ON s.study_id = t.study_id
LEFT JOIN trial_values v ON v.trial_id = t.trial_id AND v.objective = 0
LEFT JOIN salus_trials st ON st.trial_id = t.trial_id;

-- Completed trials ranked within their study, best first (rank 1).
CREATE VIEW salus_best_trials AS
SELECT ts.*,
       RANK() OVER (PARTITION BY ts.study_id
                    ORDER BY CASE d.direction WHEN 'MAXIMIZE' THEN -ts.value ELSE ts.value END) AS rank
FROM salus_trial_summary ts
JOIN study_directions d ON d.study_id = ts.study_id AND d.objective = 0
WHERE ts.state = 'COMPLETE';

-- Intermediate values: one row per trial and report step.
CREATE VIEW salus_learning_curves AS
SELECT s.study_name, t.study_id, t.trial_id, t.number, iv.step, iv.intermediate_value AS value
FROM trial_intermediate_values iv
JOIN trials t ON t.trial_id = iv.trial_id
JOIN studies s ON s.study_id = t.study_id;
