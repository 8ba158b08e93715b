-- Finished trials' models (`[study] keep`): the weights as a safetensors
-- file's bytes, and a JSON document saying how to run them. `salus-tune
-- export` writes both out. Only COMPLETE trials have one.
CREATE TABLE salus_models (
    trial_id INTEGER NOT NULL PRIMARY KEY REFERENCES trials (trial_id),
    created DATETIME NOT NULL,
    architecture TEXT NOT NULL,
    weights BLOB NOT NULL
);
