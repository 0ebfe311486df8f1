-- Verification service: task terms, the consumer's view of each task's chain events,
-- finalize / review / verifier-report requests, verdicts per attempt, verifier failures
-- and the API's signature nonces. docs/verification.md describes each table's writers.

-- Registered off-chain terms; task_hash is keccak256 of `canonical` (schemas/task_terms.py).
CREATE TABLE task_terms (
    task_hash          text        PRIMARY KEY CHECK (task_hash ~ '^0x[0-9a-f]{64}$'),
    chain_id           bigint      NOT NULL,
    escrow_address     text        NOT NULL,
    poster             text        NOT NULL,
    verification_mode  text        NOT NULL CHECK (verification_mode IN ('auto', 'manual', 'agent')),
    verifier_address   text,
    private            boolean     NOT NULL,
    terms              jsonb       NOT NULL,
    canonical          text        NOT NULL,
    registered_at      timestamptz NOT NULL DEFAULT now(),
    CHECK (verification_mode = 'agent' OR verifier_address IS NULL)
);

-- The verification consumer's copy of the escrow events it received, per task. A retraction
-- flags its event `removed`; the task's chain view is the fold of what is not removed.
CREATE TABLE verification_chain_events (
    event_id        text        PRIMARY KEY,
    chain_id        bigint      NOT NULL,
    escrow_address  text        NOT NULL,
    task_id         numeric(78) NOT NULL,
    block_number    bigint      NOT NULL,
    log_index       integer     NOT NULL,
    tx_hash         text        NOT NULL,
    event_name      text        NOT NULL,
    args            jsonb       NOT NULL,
    removed         boolean     NOT NULL DEFAULT false,
    received_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX verification_chain_events_task_idx
    ON verification_chain_events (chain_id, escrow_address, task_id, block_number, log_index);

-- Finalize, review and verifier-report requests (and retries). The API inserts a row
-- with state 'accepted' in the transaction that queues the message; the consumer moves it
-- on: pending -> applied | stored | rejected | superseded, or waiting_retry -> retry_queued
-- -> pending when the verifier could not answer.
CREATE TABLE verification_requests (
    request_id      text        PRIMARY KEY,
    kind            text        NOT NULL
                    CHECK (kind IN ('finalize', 'review', 'verifier_verdict', 'verifier_error', 'retry')),
    chain_id        bigint      NOT NULL,
    escrow_address  text        NOT NULL,
    task_id         numeric(78) NOT NULL,
    attempt         smallint    NOT NULL CHECK (attempt BETWEEN 1 AND 3),
    evidence_hash   text        NOT NULL,
    actor           text        NOT NULL,
    payload         jsonb       NOT NULL,
    state           text        NOT NULL DEFAULT 'accepted'
                    CHECK (state IN ('accepted', 'pending', 'applied', 'stored', 'rejected',
                                     'superseded', 'waiting_retry', 'retry_queued')),
    reason          text,
    retry_count     integer     NOT NULL DEFAULT 0,
    next_retry_at   timestamptz,
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX verification_requests_task_idx
    ON verification_requests (chain_id, escrow_address, task_id, attempt);
CREATE INDEX verification_requests_actor_idx ON verification_requests (actor, kind);
CREATE INDEX verification_requests_retry_idx
    ON verification_requests (next_retry_at) WHERE state = 'waiting_retry';

-- One verdict per attempt, ever: the UNIQUE key is what makes "judged at most once" hold.
-- `status` 'retracted' marks a verdict whose evidence a reorg removed; it comes back to
-- 'final' if the same evidence returns.
CREATE TABLE verification_results (
    chain_id            bigint      NOT NULL,
    escrow_address      text        NOT NULL,
    task_id             numeric(78) NOT NULL,
    attempt             smallint    NOT NULL CHECK (attempt BETWEEN 1 AND 3),
    evidence_hash       text        NOT NULL,
    agent               text,
    mode                text        NOT NULL CHECK (mode IN ('auto', 'manual', 'agent')),
    source              text        NOT NULL CHECK (source IN ('auto', 'manual', 'agent', 'chain')),
    passed              boolean     NOT NULL,
    score               smallint    NOT NULL CHECK (score BETWEEN 0 AND 100),
    result              jsonb       NOT NULL,
    reported            boolean     NOT NULL DEFAULT false,
    request_id          text,
    verdict_message_id  text,
    signed_verdict      jsonb,
    status              text        NOT NULL DEFAULT 'final' CHECK (status IN ('final', 'retracted')),
    settled_tx          text,
    settled_block       bigint,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (chain_id, escrow_address, task_id, attempt)
);
CREATE INDEX verification_results_agent_idx ON verification_results (agent);

-- A verifier agent's failed tries per attempt; after 5 the attempt is delivered but never judged.
CREATE TABLE verifier_failures (
    chain_id        bigint      NOT NULL,
    escrow_address  text        NOT NULL,
    task_id         numeric(78) NOT NULL,
    attempt         smallint    NOT NULL CHECK (attempt BETWEEN 1 AND 3),
    verifier        text        NOT NULL,
    failures        integer     NOT NULL CHECK (failures >= 0),
    never_judged    boolean     NOT NULL DEFAULT false,
    last_error      text,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (chain_id, escrow_address, task_id, attempt)
);

-- Signature nonces of the API, kept until their signature expires: a replay is a conflict.
CREATE TABLE api_nonces (
    signer      text        NOT NULL,
    nonce       text        NOT NULL,
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (signer, nonce)
);
CREATE INDEX api_nonces_expiry_idx ON api_nonces (expires_at);
