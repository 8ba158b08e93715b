-- The Salus core's telemetry: enough to rebuild each lane's timeline.

-- One row per run of the core (each `salus-tune run`, resumes included).
CREATE TABLE salus_runs (
    run_id INTEGER NOT NULL PRIMARY KEY,
    study_id INTEGER NOT NULL REFERENCES studies (study_id),
    started_at DATETIME NOT NULL,
    device TEXT NOT NULL,
    policy VARCHAR(16) NOT NULL,
    lanes INTEGER NOT NULL,
    threads_per_lane INTEGER NOT NULL,
    budget_bytes INTEGER NOT NULL
);

-- Consecutive iterations of one trial on one lane; times in seconds since
-- the run started.
CREATE TABLE salus_lane_segments (
    segment_id INTEGER NOT NULL PRIMARY KEY,
    run_id INTEGER NOT NULL REFERENCES salus_runs (run_id),
    lane INTEGER NOT NULL,
    trial_id INTEGER REFERENCES trials (trial_id),
    start_s REAL NOT NULL,
    end_s REAL NOT NULL,
    iterations INTEGER NOT NULL
);
CREATE INDEX ix_salus_lane_segments_run ON salus_lane_segments (run_id, lane, start_s);

-- Every move of a trial's persistent state between host and device.
CREATE TABLE salus_swaps (
    swap_id INTEGER NOT NULL PRIMARY KEY,
    run_id INTEGER NOT NULL REFERENCES salus_runs (run_id),
    trial_id INTEGER REFERENCES trials (trial_id),
    lane INTEGER NOT NULL,
    direction VARCHAR(3) NOT NULL, -- 'in' or 'out'
    bytes INTEGER NOT NULL,
    seconds REAL NOT NULL,
    time_s REAL NOT NULL
);

-- Per lane and run: iterations, busy time, and switch latency.
CREATE TABLE salus_lane_stats (
    run_id INTEGER NOT NULL REFERENCES salus_runs (run_id),
    lane INTEGER NOT NULL,
    iterations INTEGER NOT NULL,
    busy_s REAL NOT NULL,
    wall_s REAL NOT NULL,
    switches INTEGER NOT NULL,
    switch_mean_us REAL,
    switch_max_us REAL,
    PRIMARY KEY (run_id, lane)
);

-- Busy fraction of each lane in each run.
CREATE VIEW salus_lane_utilisation AS
SELECT r.run_id, s.study_name, ls.lane, ls.iterations, ls.busy_s, ls.wall_s,
       CASE WHEN ls.wall_s > 0 THEN ls.busy_s / ls.wall_s END AS busy_fraction,
       ls.switches, ls.switch_mean_us, ls.switch_max_us
FROM salus_lane_stats ls
JOIN salus_runs r ON r.run_id = ls.run_id
JOIN studies s ON s.study_id = r.study_id;
