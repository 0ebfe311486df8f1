-- Consumers: the inbox that makes every consumer idempotent, and dead letters kept for replay.

CREATE TABLE consumer_inbox (
    consumer     text        NOT NULL,
    message_id   text        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);

CREATE TABLE dead_letters (
    id          bigserial   PRIMARY KEY,
    consumer    text        NOT NULL,
    topic       text        NOT NULL,
    partition   integer     NOT NULL,
    "offset"    bigint      NOT NULL,
    message_id  text,
    reason      text        NOT NULL,
    payload     bytea,
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (consumer, topic, partition, "offset")
);
