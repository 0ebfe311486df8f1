-- Settlement relayer: accepted verdicts (the idempotency key), rejected ones, the local
-- nonce counter, the transactions (one row per nonce used) and every signed version of
-- each transaction (replacements share the nonce, so at most one of them can be mined).

-- One row per (chain, escrow, task, attempt): written before anything is signed, so a
-- second verdict for the same attempt can never get a transaction of its own.
CREATE TABLE settlement_verdicts (
    id             bigserial   PRIMARY KEY,
    chain_id       bigint      NOT NULL,
    escrow         text        NOT NULL,  -- lower-case 0x address
    task_id        numeric(78) NOT NULL,
    attempt        smallint    NOT NULL CHECK (attempt BETWEEN 1 AND 255),
    evidence_hash  text        NOT NULL,
    passed         boolean     NOT NULL,
    score          smallint    NOT NULL CHECK (score BETWEEN 0 AND 100),
    message_id     text        NOT NULL,
    signer         text        NOT NULL,
    signed_verdict jsonb       NOT NULL,
    -- awaiting_evidence: signature fine, the attempt is not indexed yet;
    -- queued: ready to send; sent: a nonce and a signed transaction exist;
    -- confirmed: mined `confirmations` deep; already_judged: the chain had a verdict;
    -- reverted: refused by the escrow (preflight or mined), with the decoded error.
    status         text        NOT NULL CHECK (status IN
                       ('awaiting_evidence', 'queued', 'sent', 'confirmed', 'already_judged', 'reverted')),
    error          text,
    error_args     jsonb,
    tx_hash        text,
    block_number   bigint,
    block_hash     text,
    reorgs         integer     NOT NULL DEFAULT 0,
    issued_at      timestamptz,
    received_at    timestamptz NOT NULL DEFAULT now(),
    wait_until     timestamptz,
    sent_at        timestamptz,
    confirmed_at   timestamptz,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    UNIQUE (chain_id, escrow, task_id, attempt)
);
CREATE INDEX settlement_verdicts_open_idx ON settlement_verdicts (chain_id, status, id)
    WHERE status IN ('awaiting_evidence', 'queued', 'sent');

-- Verdicts refused before any transaction: bad or untrusted signature, stale attempt,
-- wrong evidence hash, unknown escrow... Kept for operators; never sent.
CREATE TABLE settlement_rejections (
    id          bigserial   PRIMARY KEY,
    message_id  text,
    chain_id    bigint,
    escrow      text,
    task_id     numeric(78),
    attempt     integer,
    signer      text,
    reason      text        NOT NULL,
    detail      text,
    payload     bytea,
    -- Redelivery of the same message records nothing new.
    dedup_key   text        NOT NULL UNIQUE,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- The next nonce this relayer will use for an address on a chain. Advanced in the same
-- transaction that stores the signed transaction using it: no nonce without a transaction.
CREATE TABLE settlement_nonces (
    chain_id    bigint      NOT NULL,
    address     text        NOT NULL,  -- lower-case
    next_nonce  bigint      NOT NULL CHECK (next_nonce >= 0),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (chain_id, address)
);

-- One logical transaction per nonce: a verdict, or a filler (0-value self-transfer) that
-- closes a gap or cancels a verdict the chain no longer needs.
CREATE TABLE settlement_transactions (
    chain_id       bigint      NOT NULL,
    sender         text        NOT NULL,
    nonce          bigint      NOT NULL CHECK (nonce >= 0),
    verdict_id     bigint      REFERENCES settlement_verdicts (id),
    kind           text        NOT NULL CHECK (kind IN ('verdict', 'filler')),
    -- pending: not mined; mined: in a block, not yet deep enough; confirmed; lost: the
    -- nonce was consumed by a transaction that is not ours.
    state          text        NOT NULL CHECK (state IN ('pending', 'mined', 'confirmed', 'lost')),
    mined_hash     text,
    block_number   bigint,
    block_hash     text,
    receipt_status smallint,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (chain_id, sender, nonce)
);
-- A verdict has at most one live nonce: it is never sent under two nonces at once. A slot
-- stops counting when its nonce went to someone else's transaction (lost) or when it was
-- mined and reverted (the verdict may then be queued again, e.g. after a key rotation).
CREATE UNIQUE INDEX settlement_transactions_one_live_per_verdict
    ON settlement_transactions (verdict_id)
    WHERE kind = 'verdict' AND state <> 'lost' AND receipt_status IS DISTINCT FROM 0;
CREATE INDEX settlement_transactions_open_idx ON settlement_transactions (chain_id, sender, state)
    WHERE state IN ('pending', 'mined');

-- Every signed version of a transaction (the first one and each fee-bumped replacement).
CREATE TABLE settlement_tx_versions (
    tx_hash                  text        PRIMARY KEY,
    chain_id                 bigint      NOT NULL,
    sender                   text        NOT NULL,
    nonce                    bigint      NOT NULL,
    version                  integer     NOT NULL CHECK (version >= 0),
    kind                     text        NOT NULL CHECK (kind IN ('verdict', 'filler')),
    raw_tx                   text        NOT NULL,  -- signed and public once broadcast: not a secret
    max_fee_per_gas          numeric(78) NOT NULL,
    max_priority_fee_per_gas numeric(78) NOT NULL,
    gas_limit                bigint      NOT NULL,
    created_at               timestamptz NOT NULL DEFAULT now(),
    broadcast_at             timestamptz,
    FOREIGN KEY (chain_id, sender, nonce) REFERENCES settlement_transactions (chain_id, sender, nonce),
    UNIQUE (chain_id, sender, nonce, version)
);
