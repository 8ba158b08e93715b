-- Many processes on one study (one per GPU, one per machine): each run of
-- the core says where it runs and that it is alive, and each RUNNING trial
-- says which run holds it. A trial whose run is gone (its process is dead
-- on this host, or its heartbeat is stale) is requeued by whichever
-- process notices first.
ALTER TABLE salus_runs ADD COLUMN host TEXT;
ALTER TABLE salus_runs ADD COLUMN pid INTEGER;
-- 0 for the first live process of the study; its sampler draws from
-- seed + process_index, so that processes do not propose the same points.
ALTER TABLE salus_runs ADD COLUMN process_index INTEGER;
ALTER TABLE salus_runs ADD COLUMN heartbeat DATETIME;
ALTER TABLE salus_runs ADD COLUMN ended DATETIME;

-- The run that holds each trial it claimed (created, or took from WAITING).
CREATE TABLE salus_claims (
    trial_id INTEGER NOT NULL PRIMARY KEY REFERENCES trials (trial_id),
    run_id INTEGER NOT NULL REFERENCES salus_runs (run_id),
    claimed DATETIME NOT NULL
);
