-- Optuna 5.0's schema on PostgreSQL (alembic v3.2.0.a, schema version 12),
-- as pg_dump --schema-only prints it for a database that Optuna 5.0
-- created itself, with the two version rows Optuna writes.


CREATE TYPE studydirection AS ENUM (
    'NOT_SET',
    'MINIMIZE',
    'MAXIMIZE'
);

CREATE TYPE trialintermediatevaluetype AS ENUM (
    'FINITE',
    'INF_POS',
    'INF_NEG',
    'NAN'
);

CREATE TYPE trialstate AS ENUM (
    'RUNNING',
    'COMPLETE',
    'PRUNED',
    'FAIL',
    'WAITING'
);

CREATE TYPE trialvaluetype AS ENUM (
    'FINITE',
    'INF_POS',
    'INF_NEG'
);

CREATE TABLE alembic_version (
    version_num character varying(32) NOT NULL
);

CREATE TABLE studies (
    study_id integer NOT NULL,
    study_name character varying(512) NOT NULL
);

CREATE SEQUENCE studies_study_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE studies_study_id_seq OWNED BY studies.study_id;

CREATE TABLE study_directions (
    study_direction_id integer NOT NULL,
    direction studydirection NOT NULL,
    study_id integer NOT NULL,
    objective integer NOT NULL
);

CREATE SEQUENCE study_directions_study_direction_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE study_directions_study_direction_id_seq OWNED BY study_directions.study_direction_id;

CREATE TABLE study_system_attributes (
    study_system_attribute_id integer NOT NULL,
    study_id integer,
    key character varying(512),
    value_json text
);

CREATE SEQUENCE study_system_attributes_study_system_attribute_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE study_system_attributes_study_system_attribute_id_seq OWNED BY study_system_attributes.study_system_attribute_id;

CREATE TABLE study_user_attributes (
    study_user_attribute_id integer NOT NULL,
    study_id integer,
    key character varying(512),
    value_json text
);

CREATE SEQUENCE study_user_attributes_study_user_attribute_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE study_user_attributes_study_user_attribute_id_seq OWNED BY study_user_attributes.study_user_attribute_id;

CREATE TABLE trial_heartbeats (
    trial_heartbeat_id integer NOT NULL,
    trial_id integer NOT NULL,
    heartbeat timestamp without time zone NOT NULL
);

CREATE SEQUENCE trial_heartbeats_trial_heartbeat_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE trial_heartbeats_trial_heartbeat_id_seq OWNED BY trial_heartbeats.trial_heartbeat_id;

CREATE TABLE trial_intermediate_values (
    trial_intermediate_value_id integer NOT NULL,
    trial_id integer NOT NULL,
    step integer NOT NULL,
    intermediate_value double precision,
    intermediate_value_type trialintermediatevaluetype NOT NULL
);

CREATE SEQUENCE trial_intermediate_values_trial_intermediate_value_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE trial_intermediate_values_trial_intermediate_value_id_seq OWNED BY trial_intermediate_values.trial_intermediate_value_id;

CREATE TABLE trial_params (
    param_id integer NOT NULL,
    trial_id integer,
    param_name character varying(512),
    param_value double precision,
    distribution_json text
);

CREATE SEQUENCE trial_params_param_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE trial_params_param_id_seq OWNED BY trial_params.param_id;

CREATE TABLE trial_system_attributes (
    trial_system_attribute_id integer NOT NULL,
    trial_id integer,
    key character varying(512),
    value_json text
);

CREATE SEQUENCE trial_system_attributes_trial_system_attribute_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE trial_system_attributes_trial_system_attribute_id_seq OWNED BY trial_system_attributes.trial_system_attribute_id;

CREATE TABLE trial_user_attributes (
    trial_user_attribute_id integer NOT NULL,
    trial_id integer,
    key character varying(512),
    value_json text
);

CREATE SEQUENCE trial_user_attributes_trial_user_attribute_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE trial_user_attributes_trial_user_attribute_id_seq OWNED BY trial_user_attributes.trial_user_attribute_id;

CREATE TABLE trial_values (
    trial_value_id integer NOT NULL,
    trial_id integer NOT NULL,
    objective integer NOT NULL,
    value double precision,
    value_type trialvaluetype NOT NULL
);

CREATE SEQUENCE trial_values_trial_value_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE trial_values_trial_value_id_seq OWNED BY trial_values.trial_value_id;

CREATE TABLE trials (
    trial_id integer NOT NULL,
    number integer,
    study_id integer,
    state trialstate NOT NULL,
    datetime_start timestamp without time zone,
    datetime_complete timestamp without time zone
);

CREATE SEQUENCE trials_trial_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE trials_trial_id_seq OWNED BY trials.trial_id;

CREATE TABLE version_info (
    version_info_id integer NOT NULL,
    schema_version integer,
    library_version character varying(256),
    CONSTRAINT version_info_version_info_id_check CHECK ((version_info_id = 1))
);

ALTER TABLE ONLY studies ALTER COLUMN study_id SET DEFAULT nextval('studies_study_id_seq'::regclass);

ALTER TABLE ONLY study_directions ALTER COLUMN study_direction_id SET DEFAULT nextval('study_directions_study_direction_id_seq'::regclass);

ALTER TABLE ONLY study_system_attributes ALTER COLUMN study_system_attribute_id SET DEFAULT nextval('study_system_attributes_study_system_attribute_id_seq'::regclass);

ALTER TABLE ONLY study_user_attributes ALTER COLUMN study_user_attribute_id SET DEFAULT nextval('study_user_attributes_study_user_attribute_id_seq'::regclass);

ALTER TABLE ONLY trial_heartbeats ALTER COLUMN trial_heartbeat_id SET DEFAULT nextval('trial_heartbeats_trial_heartbeat_id_seq'::regclass);

ALTER TABLE ONLY trial_intermediate_values ALTER COLUMN trial_intermediate_value_id SET DEFAULT nextval('trial_intermediate_values_trial_intermediate_value_id_seq'::regclass);

ALTER TABLE ONLY trial_params ALTER COLUMN param_id SET DEFAULT nextval('trial_params_param_id_seq'::regclass);

ALTER TABLE ONLY trial_system_attributes ALTER COLUMN trial_system_attribute_id SET DEFAULT nextval('trial_system_attributes_trial_system_attribute_id_seq'::regclass);

ALTER TABLE ONLY trial_user_attributes ALTER COLUMN trial_user_attribute_id SET DEFAULT nextval('trial_user_attributes_trial_user_attribute_id_seq'::regclass);

ALTER TABLE ONLY trial_values ALTER COLUMN trial_value_id SET DEFAULT nextval('trial_values_trial_value_id_seq'::regclass);

ALTER TABLE ONLY trials ALTER COLUMN trial_id SET DEFAULT nextval('trials_trial_id_seq'::regclass);

ALTER TABLE ONLY alembic_version
    ADD CONSTRAINT alembic_version_pkc PRIMARY KEY (version_num);

ALTER TABLE ONLY studies
    ADD CONSTRAINT studies_pkey PRIMARY KEY (study_id);

ALTER TABLE ONLY study_directions
    ADD CONSTRAINT study_directions_pkey PRIMARY KEY (study_direction_id);

ALTER TABLE ONLY study_directions
    ADD CONSTRAINT study_directions_study_id_objective_key UNIQUE (study_id, objective);

ALTER TABLE ONLY study_system_attributes
    ADD CONSTRAINT study_system_attributes_pkey PRIMARY KEY (study_system_attribute_id);

ALTER TABLE ONLY study_system_attributes
    ADD CONSTRAINT study_system_attributes_study_id_key_key UNIQUE (study_id, key);

ALTER TABLE ONLY study_user_attributes
    ADD CONSTRAINT study_user_attributes_pkey PRIMARY KEY (study_user_attribute_id);

ALTER TABLE ONLY study_user_attributes
    ADD CONSTRAINT study_user_attributes_study_id_key_key UNIQUE (study_id, key);

ALTER TABLE ONLY trial_heartbeats
    ADD CONSTRAINT trial_heartbeats_pkey PRIMARY KEY (trial_heartbeat_id);

ALTER TABLE ONLY trial_heartbeats
    ADD CONSTRAINT trial_heartbeats_trial_id_key UNIQUE (trial_id);

ALTER TABLE ONLY trial_intermediate_values
    ADD CONSTRAINT trial_intermediate_values_pkey PRIMARY KEY (trial_intermediate_value_id);

ALTER TABLE ONLY trial_intermediate_values
    ADD CONSTRAINT trial_intermediate_values_trial_id_step_key UNIQUE (trial_id, step);

ALTER TABLE ONLY trial_params
    ADD CONSTRAINT trial_params_pkey PRIMARY KEY (param_id);

ALTER TABLE ONLY trial_params
    ADD CONSTRAINT trial_params_trial_id_param_name_key UNIQUE (trial_id, param_name);

ALTER TABLE ONLY trial_system_attributes
    ADD CONSTRAINT trial_system_attributes_pkey PRIMARY KEY (trial_system_attribute_id);

ALTER TABLE ONLY trial_system_attributes
    ADD CONSTRAINT trial_system_attributes_trial_id_key_key UNIQUE (trial_id, key);

ALTER TABLE ONLY trial_user_attributes
    ADD CONSTRAINT trial_user_attributes_pkey PRIMARY KEY (trial_user_attribute_id);

ALTER TABLE ONLY trial_user_attributes
    ADD CONSTRAINT trial_user_attributes_trial_id_key_key UNIQUE (trial_id, key);

ALTER TABLE ONLY trial_values
    ADD CONSTRAINT trial_values_pkey PRIMARY KEY (trial_value_id);

ALTER TABLE ONLY trial_values
    ADD CONSTRAINT trial_values_trial_id_objective_key UNIQUE (trial_id, objective);

ALTER TABLE ONLY trials
    ADD CONSTRAINT trials_pkey PRIMARY KEY (trial_id);

ALTER TABLE ONLY version_info
    ADD CONSTRAINT version_info_pkey PRIMARY KEY (version_info_id);

CREATE UNIQUE INDEX ix_studies_study_name ON studies USING btree (study_name);

CREATE INDEX ix_trials_study_id ON trials USING btree (study_id);

ALTER TABLE ONLY study_directions
    ADD CONSTRAINT study_directions_study_id_fkey FOREIGN KEY (study_id) REFERENCES studies(study_id);

ALTER TABLE ONLY study_system_attributes
    ADD CONSTRAINT study_system_attributes_study_id_fkey FOREIGN KEY (study_id) REFERENCES studies(study_id);

ALTER TABLE ONLY study_user_attributes
    ADD CONSTRAINT study_user_attributes_study_id_fkey FOREIGN KEY (study_id) REFERENCES studies(study_id);

ALTER TABLE ONLY trial_heartbeats
    ADD CONSTRAINT trial_heartbeats_trial_id_fkey FOREIGN KEY (trial_id) REFERENCES trials(trial_id);

ALTER TABLE ONLY trial_intermediate_values
    ADD CONSTRAINT trial_intermediate_values_trial_id_fkey FOREIGN KEY (trial_id) REFERENCES trials(trial_id);

ALTER TABLE ONLY trial_params
    ADD CONSTRAINT trial_params_trial_id_fkey FOREIGN KEY (trial_id) REFERENCES trials(trial_id);

ALTER TABLE ONLY trial_system_attributes
    ADD CONSTRAINT trial_system_attributes_trial_id_fkey FOREIGN KEY (trial_id) REFERENCES trials(trial_id);

ALTER TABLE ONLY trial_user_attributes
    ADD CONSTRAINT trial_user_attributes_trial_id_fkey FOREIGN KEY (trial_id) REFERENCES trials(trial_id);

ALTER TABLE ONLY trial_values
    ADD CONSTRAINT trial_values_trial_id_fkey FOREIGN KEY (trial_id) REFERENCES trials(trial_id);

ALTER TABLE ONLY trials
    ADD CONSTRAINT trials_study_id_fkey FOREIGN KEY (study_id) REFERENCES studies(study_id);

INSERT INTO version_info (version_info_id, schema_version, library_version) VALUES (1, 12, '5.0.0');
INSERT INTO alembic_version (version_num) VALUES ('v3.2.0.a');
