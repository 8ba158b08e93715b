-- Population-based training across processes: each member's arrival at an
-- exploit point (generation), with its value there and its parameters (a
-- typed JSON object), and the file its state at that point was saved to,
-- so that a process deciding the generation ranks members it does not
-- hold and reads a donor's state from disk. Written only while other
-- processes share the study.
CREATE TABLE salus_pbt_points (
    study_id INTEGER NOT NULL REFERENCES studies (study_id),
    trial_id INTEGER NOT NULL REFERENCES trials (trial_id),
    generation INTEGER NOT NULL,
    step INTEGER NOT NULL,
    iteration INTEGER NOT NULL,
    value DOUBLE PRECISION,
    params TEXT NOT NULL,
    state_file TEXT,
    time TIMESTAMP WITHOUT TIME ZONE NOT NULL,
    PRIMARY KEY (trial_id, generation)
);
CREATE INDEX ix_salus_pbt_points_study ON salus_pbt_points (study_id, generation);
