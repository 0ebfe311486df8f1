-- Poison-pill marks: the message each consumer run is handling right now, per partition.
-- Written (and cleared) on a connection of its own that commits at once, so a mark outlives
-- a process that dies inside a handler; the next run dead-letters that message instead of
-- handling it again (or after `deaths` reaches the consumer's `poison_after_deaths`).
-- `offset` is NULL when no handler of the partition is running.

CREATE TABLE consumer_in_flight (
    consumer    text        NOT NULL,
    topic       text        NOT NULL,
    partition   integer     NOT NULL,
    "offset"    bigint,
    run_id      text        NOT NULL,
    deaths      integer     NOT NULL DEFAULT 0,  -- runs that already died in this offset's handler
    started_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, topic, partition)
);

CREATE INDEX consumer_in_flight_run_idx ON consumer_in_flight (consumer, run_id) WHERE "offset" IS NOT NULL;
