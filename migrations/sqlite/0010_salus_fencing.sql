-- Fenced writes. Each claim of a trial is an attempt, numbered from 1; a
-- requeue releases it (the row stays, so the next claim numbers on). Every
-- write for a trial names its claim (run and attempt) and lands only while
-- that claim is the trial's current one: a process that was paused past
-- the liveness limit and lost its trials writes nothing for them.
ALTER TABLE salus_claims ADD COLUMN attempt INTEGER NOT NULL DEFAULT 1;
ALTER TABLE salus_claims ADD COLUMN released DATETIME;
-- Tells processes on one host name apart when their pid namespaces (or
-- boots) differ: a pid says whether a run lives only when this matches.
ALTER TABLE salus_runs ADD COLUMN pid_namespace TEXT;
-- Which run took a dashboard command, and what came of it.
ALTER TABLE salus_commands ADD COLUMN applied_by INTEGER;
ALTER TABLE salus_commands ADD COLUMN outcome TEXT;
-- Who wrote what: the claim behind each stored step ('step') and a trial's
-- end ('end', step 0). A later write of the same item replaces the row.
CREATE TABLE salus_writes (
    trial_id INTEGER NOT NULL REFERENCES trials (trial_id),
    kind VARCHAR(16) NOT NULL,
    step INTEGER NOT NULL,
    run_id INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    PRIMARY KEY (trial_id, kind, step)
);
-- Each trial's latest checkpoint: the claim that wrote it and the step it
-- covers (an external worker's file is named by that attempt).
CREATE TABLE salus_checkpoints (
    trial_id INTEGER NOT NULL PRIMARY KEY REFERENCES trials (trial_id),
    run_id INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    step INTEGER NOT NULL
);
