-- Typed parameter values in the views: integers as integers, booleans as
-- JSON true/false in `params` (they were floats and 0/1).

DROP VIEW salus_best_trials;
DROP VIEW salus_trial_summary;
DROP VIEW salus_params;

-- Parameters with categoricals decoded to their chosen value. `value` is an
-- SQL value (an IntDistribution's is an integer); `value_json` is the same
-- value as JSON text, which keeps booleans.
CREATE VIEW salus_params AS
SELECT s.study_name, t.study_id, t.trial_id, t.number, p.param_name,
       CASE json_extract(p.distribution_json, '$.name')
            WHEN 'CategoricalDistribution'
            THEN json_extract(p.distribution_json, '$.attributes.choices[' || CAST(p.param_value AS INTEGER) || ']')
            WHEN 'IntDistribution' THEN CAST(p.param_value AS INTEGER)
            ELSE p.param_value END AS value,
       CASE json_extract(p.distribution_json, '$.name')
            WHEN 'CategoricalDistribution'
            THEN CASE json_type(p.distribution_json, '$.attributes.choices[' || CAST(p.param_value AS INTEGER) || ']')
                      WHEN 'true' THEN 'true'
                      WHEN 'false' THEN 'false'
                      WHEN 'null' THEN 'null'
                      ELSE json_quote(json_extract(p.distribution_json, '$.attributes.choices[' || CAST(p.param_value AS INTEGER) || ']')) END
            WHEN 'IntDistribution' THEN json_quote(CAST(p.param_value AS INTEGER))
            ELSE json_quote(p.param_value) END AS value_json,
       p.param_value AS internal_value
FROM trial_params p
JOIN trials t ON t.trial_id = p.trial_id
JOIN studies s ON s.study_id = t.study_id;

-- One row per trial: state, value, parameters as a typed JSON object, timing.
CREATE VIEW salus_trial_summary AS
SELECT s.study_name, t.study_id, t.trial_id, t.number, t.state, v.value,
       (SELECT json_group_object(sp.param_name, json(sp.value_json)) FROM salus_params sp WHERE sp.trial_id = t.trial_id) AS params,
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
