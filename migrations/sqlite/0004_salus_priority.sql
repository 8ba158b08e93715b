-- Early-stopping-aware priorities: every change, with its reason.
CREATE TABLE salus_priority (
    priority_id INTEGER NOT NULL PRIMARY KEY,
    trial_id INTEGER NOT NULL REFERENCES trials (trial_id),
    time DATETIME NOT NULL,
    priority REAL NOT NULL,
    rung INTEGER,
    reason VARCHAR(32) NOT NULL -- rung, paused, promoted, pruned
);
CREATE INDEX ix_salus_priority_trial ON salus_priority (trial_id, priority_id);
