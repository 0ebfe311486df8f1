-- The finalized-only stream: each chain's event log published a second time, to its own topic,
-- once the blocks are final (runtime/finalstream.py).
--
-- `chain_cursor.finalized_through`: the highest block the chain calls finalized (its
-- `finalized` tag, or the head minus `fallback_confirmations` where the node has no tag),
-- written by the indexer, only ever raised. The stream's line is the lower of it and the cursor.
-- `event_log_stream_watermarks`: per (chain, topic), like `event_log_watermarks`:
-- `sending_through` committed before a send, `published_through` moved after the acks.

ALTER TABLE chain_cursor ADD COLUMN finalized_through bigint;

CREATE TABLE event_log_stream_watermarks (
    chain_id          bigint      NOT NULL,
    topic             text        NOT NULL,
    published_through bigint      NOT NULL DEFAULT 0,
    sending_through   bigint      NOT NULL DEFAULT 0,
    updated_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (chain_id, topic),
    CHECK (sending_through >= published_through)
);
