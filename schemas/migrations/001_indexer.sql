-- Indexer: the chain cursor, recent block hashes, decoded escrow events and the outbox.
-- The cursor, the blocks, the events and the outbox rows of one batch are written in one
-- transaction, so a crash at any instant leaves them consistent with each other.

CREATE TABLE chain_cursor (
    chain_id       bigint      PRIMARY KEY,
    block_number   bigint      NOT NULL CHECK (block_number >= -1),
    block_hash     text        NOT NULL,
    -- The publisher holds back rows of blocks less than `confirmations` deep.
    confirmations  integer     NOT NULL DEFAULT 0 CHECK (confirmations >= 0),
    head_number    bigint      NOT NULL DEFAULT -1,
    head_timestamp bigint      NOT NULL DEFAULT 0,
    updated_at     timestamptz NOT NULL DEFAULT now()
);

-- Hashes of recent blocks, for parent checks and for finding the common ancestor.
CREATE TABLE chain_blocks (
    chain_id     bigint NOT NULL,
    block_number bigint NOT NULL,
    block_hash   text   NOT NULL,
    parent_hash  text   NOT NULL,
    timestamp    bigint NOT NULL,
    PRIMARY KEY (chain_id, block_number)
);

CREATE TABLE escrow_events (
    -- Deterministic id: "<chain id>:<block hash>:<log index>".
    event_id        text        PRIMARY KEY,
    chain_id        bigint      NOT NULL,
    escrow_address  text        NOT NULL,
    block_number    bigint      NOT NULL,
    block_hash      text        NOT NULL,
    block_timestamp bigint      NOT NULL,
    tx_hash         text        NOT NULL,
    tx_index        integer     NOT NULL,
    log_index       integer     NOT NULL,
    event_name      text        NOT NULL,
    task_id         numeric(78),
    args            jsonb       NOT NULL,
    indexed_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (chain_id, block_hash, log_index)
);
CREATE INDEX escrow_events_block_idx ON escrow_events (chain_id, block_number);
CREATE INDEX escrow_events_task_idx ON escrow_events (chain_id, task_id, block_number, log_index);

-- Messages to publish. Rows carrying a block number wait until that block is deep enough.
CREATE TABLE outbox (
    seq          bigserial   PRIMARY KEY,
    message_id   text        NOT NULL,
    topic        text        NOT NULL,
    key          bytea,
    headers      jsonb       NOT NULL DEFAULT '{}'::jsonb,
    payload      bytea       NOT NULL,
    chain_id     bigint,
    block_number bigint,
    event_id     text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    -- Incremented before each send: a row tried but never marked may be on Kafka.
    send_attempts integer    NOT NULL DEFAULT 0,
    published_at timestamptz,
    UNIQUE (topic, message_id)
);
CREATE INDEX outbox_pending_idx ON outbox (seq) WHERE published_at IS NULL;
CREATE INDEX outbox_event_idx ON outbox (event_id) WHERE event_id IS NOT NULL;

-- Events removed by a reorg, with how many times: if the same event comes back (a reorg
-- A → B → A), it is published under a new message id `<event id>#<n>`.
CREATE TABLE event_retractions (
    event_id    text    PRIMARY KEY,
    retractions integer NOT NULL CHECK (retractions > 0)
);
