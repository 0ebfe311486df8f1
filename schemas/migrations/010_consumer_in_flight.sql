-- Poison-pill marks: what each consumer run is handling right now.
-- Inserted (never updated) on a connection of its own that commits at once, before each
-- handler runs; the newest row of a run says what it was doing: a message (topic,
-- partition, offset) or nothing (offset NULL, written at the end of each batch, which also
-- deletes the run's older rows). A run that died leaves its newest row: the next run
-- dead-letters that message instead of handling it again (or after `deaths` reaches the
-- consumer's `poison_after_deaths`).

CREATE TABLE consumer_in_flight (
    seq         bigserial   PRIMARY KEY,
    consumer    text        NOT NULL,
    run_id      text        NOT NULL,
    topic       text,
    partition   integer,
    "offset"    bigint,
    deaths      integer     NOT NULL DEFAULT 0,  -- runs that already died in this message's handler
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX consumer_in_flight_run_idx ON consumer_in_flight (consumer, run_id, seq);
