-- Auxiliary curves an external worker reports beside its metric
-- (`trial.report(step, value, train_loss=...)`): one row per trial, name
-- and step. The latest value of each is also the trial's user attribute of
-- that name, where Optuna's tools show it. NaN is stored as NULL.
CREATE TABLE salus_metrics (
    trial_id INTEGER NOT NULL REFERENCES trials (trial_id),
    name VARCHAR(512) NOT NULL,
    step INTEGER NOT NULL,
    value REAL,
    PRIMARY KEY (trial_id, name, step)
);
