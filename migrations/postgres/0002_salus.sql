-- salus-tune's own tables on PostgreSQL: the schema that SQLite's
-- migrations 0002 to 0009 reach, in one step (no PostgreSQL database is
-- older than it). Optuna ignores tables it does not know.
--
-- Types follow SQLite's columns: INTEGER keys that count (trial ids are
-- Optuna's INTEGER), BIGINT for byte counts, DOUBLE PRECISION for REAL,
-- TIMESTAMP WITHOUT TIME ZONE for DATETIME (naive local time, as Optuna
-- writes its own), BYTEA for BLOB.

-- One row per trial: where it ran, what it needed, how far it got.
CREATE TABLE salus_trials (
    trial_id INTEGER NOT NULL PRIMARY KEY REFERENCES trials (trial_id),
    device TEXT NOT NULL,
    lane INTEGER,
    persistent_bytes BIGINT NOT NULL DEFAULT 0,
    ephemeral_bytes BIGINT NOT NULL DEFAULT 0,
    shared_bytes BIGINT NOT NULL DEFAULT 0,
    iterations BIGINT NOT NULL DEFAULT 0,
    total_iterations BIGINT NOT NULL DEFAULT 0,
    device_seconds DOUBLE PRECISION NOT NULL DEFAULT 0,
    fail_reason TEXT
);

-- Everything that happened, in order. detail is JSON.
CREATE TABLE salus_events (
    event_id BIGSERIAL NOT NULL PRIMARY KEY,
    study_id INTEGER NOT NULL REFERENCES studies (study_id),
    trial_id INTEGER REFERENCES trials (trial_id),
    time TIMESTAMP WITHOUT TIME ZONE NOT NULL,
    kind VARCHAR(32) NOT NULL,
    lane INTEGER,
    detail TEXT
);
CREATE INDEX ix_salus_events_study ON salus_events (study_id, event_id);
CREATE INDEX ix_salus_events_trial ON salus_events (trial_id);

-- One row per run of the core: one per process, with where it runs, that
-- it is alive (heartbeat), and its process index (its sampler draws from
-- seed + process_index).
CREATE TABLE salus_runs (
    run_id BIGSERIAL NOT NULL PRIMARY KEY,
    study_id INTEGER NOT NULL REFERENCES studies (study_id),
    started_at TIMESTAMP WITHOUT TIME ZONE NOT NULL,
    device TEXT NOT NULL,
    policy VARCHAR(16) NOT NULL,
    lanes INTEGER NOT NULL,
    threads_per_lane INTEGER NOT NULL,
    budget_bytes BIGINT NOT NULL,
    host TEXT,
    pid BIGINT,
    process_index INTEGER,
    heartbeat TIMESTAMP WITHOUT TIME ZONE,
    ended TIMESTAMP WITHOUT TIME ZONE
);
CREATE INDEX ix_salus_runs_study ON salus_runs (study_id, ended);

-- Consecutive iterations of one trial on one lane; times in seconds since
-- the run started.
CREATE TABLE salus_lane_segments (
    segment_id BIGSERIAL NOT NULL PRIMARY KEY,
    run_id BIGINT NOT NULL REFERENCES salus_runs (run_id),
    lane INTEGER NOT NULL,
    trial_id INTEGER REFERENCES trials (trial_id),
    start_s DOUBLE PRECISION NOT NULL,
    end_s DOUBLE PRECISION NOT NULL,
    iterations BIGINT NOT NULL
);
CREATE INDEX ix_salus_lane_segments_run ON salus_lane_segments (run_id, lane, start_s);

-- Every move of a trial's persistent state between host and device.
CREATE TABLE salus_swaps (
    swap_id BIGSERIAL NOT NULL PRIMARY KEY,
    run_id BIGINT NOT NULL REFERENCES salus_runs (run_id),
    trial_id INTEGER REFERENCES trials (trial_id),
    lane INTEGER NOT NULL,
    direction VARCHAR(3) NOT NULL, -- 'in' or 'out'
    bytes BIGINT NOT NULL,
    seconds DOUBLE PRECISION NOT NULL,
    time_s DOUBLE PRECISION NOT NULL
);

-- Per lane and run: iterations, busy time, and switch latency.
CREATE TABLE salus_lane_stats (
    run_id BIGINT NOT NULL REFERENCES salus_runs (run_id),
    lane INTEGER NOT NULL,
    iterations BIGINT NOT NULL,
    busy_s DOUBLE PRECISION NOT NULL,
    wall_s DOUBLE PRECISION NOT NULL,
    switches BIGINT NOT NULL,
    switch_mean_us DOUBLE PRECISION,
    switch_max_us DOUBLE PRECISION,
    PRIMARY KEY (run_id, lane)
);

-- Early-stopping-aware priorities: every change, with its reason.
CREATE TABLE salus_priority (
    priority_id BIGSERIAL NOT NULL PRIMARY KEY,
    trial_id INTEGER NOT NULL REFERENCES trials (trial_id),
    time TIMESTAMP WITHOUT TIME ZONE NOT NULL,
    priority DOUBLE PRECISION NOT NULL,
    rung BIGINT,
    reason VARCHAR(32) NOT NULL -- rung, paused, promoted, pruned
);
CREATE INDEX ix_salus_priority_trial ON salus_priority (trial_id, priority_id);

-- Commands for a running study (pause, resume, prune), from the dashboard.
CREATE TABLE salus_commands (
    command_id BIGSERIAL NOT NULL PRIMARY KEY,
    study_id INTEGER NOT NULL REFERENCES studies (study_id),
    trial_id INTEGER NOT NULL REFERENCES trials (trial_id),
    action VARCHAR(16) NOT NULL,
    created TIMESTAMP WITHOUT TIME ZONE NOT NULL,
    applied TIMESTAMP WITHOUT TIME ZONE
);
CREATE INDEX ix_salus_commands_pending ON salus_commands (study_id, applied);

-- Auxiliary curves an external worker reports beside its metric.
CREATE TABLE salus_metrics (
    trial_id INTEGER NOT NULL REFERENCES trials (trial_id),
    name VARCHAR(512) NOT NULL,
    step BIGINT NOT NULL,
    value DOUBLE PRECISION,
    PRIMARY KEY (trial_id, name, step)
);

-- Finished trials' models (`[study] keep`).
CREATE TABLE salus_models (
    trial_id INTEGER NOT NULL PRIMARY KEY REFERENCES trials (trial_id),
    created TIMESTAMP WITHOUT TIME ZONE NOT NULL,
    architecture TEXT NOT NULL,
    weights BYTEA NOT NULL
);

-- The run that holds each trial it claimed (created, or took from WAITING).
CREATE TABLE salus_claims (
    trial_id INTEGER NOT NULL PRIMARY KEY REFERENCES trials (trial_id),
    run_id BIGINT NOT NULL REFERENCES salus_runs (run_id),
    claimed TIMESTAMP WITHOUT TIME ZONE NOT NULL
);

-- Parameters with categoricals decoded to their chosen value. `value` is
-- text here (a column has one type in PostgreSQL); `value_json` is the
-- same value as JSON text, typed: numbers, strings, true/false.
CREATE VIEW salus_params AS
SELECT s.study_name, t.study_id, t.trial_id, t.number, p.param_name,
       CASE CAST(p.distribution_json AS json) ->> 'name'
            WHEN 'CategoricalDistribution'
            THEN CAST(p.distribution_json AS json) -> 'attributes' -> 'choices' ->> CAST(p.param_value AS INTEGER)
            WHEN 'IntDistribution' THEN CAST(CAST(p.param_value AS BIGINT) AS TEXT)
            ELSE CAST(p.param_value AS TEXT) END AS value,
       CASE CAST(p.distribution_json AS json) ->> 'name'
            WHEN 'CategoricalDistribution'
            THEN CAST(CAST(p.distribution_json AS json) -> 'attributes' -> 'choices' -> CAST(p.param_value AS INTEGER) AS TEXT)
            WHEN 'IntDistribution' THEN CAST(to_json(CAST(p.param_value AS BIGINT)) AS TEXT)
            ELSE CAST(to_json(p.param_value) AS TEXT) END AS value_json,
       p.param_value AS internal_value
FROM trial_params p
JOIN trials t ON t.trial_id = p.trial_id
JOIN studies s ON s.study_id = t.study_id;

-- One row per trial: state, value, parameters as a typed JSON object, timing.
CREATE VIEW salus_trial_summary AS
SELECT s.study_name, t.study_id, t.trial_id, t.number, CAST(t.state AS TEXT) AS state, v.value,
       CAST((SELECT json_object_agg(sp.param_name, CAST(sp.value_json AS json)) FROM salus_params sp WHERE sp.trial_id = t.trial_id) AS TEXT) AS params,
       t.datetime_start, t.datetime_complete,
       CAST(EXTRACT(EPOCH FROM (t.datetime_complete - t.datetime_start)) AS DOUBLE PRECISION) AS duration_s,
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

-- Busy fraction of each lane in each run.
CREATE VIEW salus_lane_utilisation AS
SELECT r.run_id, s.study_name, ls.lane, ls.iterations, ls.busy_s, ls.wall_s,
       CASE WHEN ls.wall_s > 0 THEN ls.busy_s / ls.wall_s END AS busy_fraction,
       ls.switches, ls.switch_mean_us, ls.switch_max_us
FROM salus_lane_stats ls
JOIN salus_runs r ON r.run_id = ls.run_id
JOIN studies s ON s.study_id = r.study_id;
