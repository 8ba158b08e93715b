-- Commands for a running study: the dashboard inserts them, the running
-- orchestrator takes them (sets `applied`) and acts at the next iteration
-- boundary. `action` is 'pause', 'resume' or 'prune'.
CREATE TABLE salus_commands (
    command_id INTEGER NOT NULL PRIMARY KEY,
    study_id INTEGER NOT NULL REFERENCES studies (study_id),
    trial_id INTEGER NOT NULL REFERENCES trials (trial_id),
    action VARCHAR(16) NOT NULL,
    created DATETIME NOT NULL,
    applied DATETIME
);
CREATE INDEX ix_salus_commands_pending ON salus_commands (study_id, applied);
