-- Offsets kept in PostgreSQL by consumers that take their partitions by direct assignment
-- (the settlement relayer): written in the same transaction as the effects of the messages
-- they cover, so a restart resumes exactly where the last commit left off, with no
-- consumer-group join.

CREATE TABLE consumer_offsets (
    consumer     text        NOT NULL,
    topic        text        NOT NULL,
    partition    integer     NOT NULL,
    next_offset  bigint      NOT NULL,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, topic, partition)
);
