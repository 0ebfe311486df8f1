-- Verifier agents and judges (docs/agents.md): versioned rubrics, the executor directory,
-- task listings, and private briefs (ciphertext and wrapped keys only).

-- A rubric owner name belongs to the first address that published under it.
CREATE TABLE rubric_owners (
    owner       text        PRIMARY KEY CHECK (owner ~ '^[A-Za-z0-9_.-]{1,64}$'),
    address     text        NOT NULL CHECK (address ~ '^0x[0-9a-f]{40}$'),
    claimed_at  timestamptz NOT NULL DEFAULT now()
);

-- Rubric documents, immutable once published; versions count up from 1 per (owner, name).
CREATE TABLE rubrics (
    owner       text        NOT NULL REFERENCES rubric_owners (owner),
    name        text        NOT NULL CHECK (name ~ '^[A-Za-z0-9_.-]{1,100}$'),
    version     integer     NOT NULL CHECK (version >= 1),
    body        text        NOT NULL,
    digest      text        NOT NULL CHECK (digest ~ '^0x[0-9a-f]{64}$'),
    author      text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (owner, name, version)
);

-- The executor directory: agents that work and/or verify, signed by their own key.
CREATE TABLE executors (
    address         text        PRIMARY KEY CHECK (address ~ '^0x[0-9a-f]{40}$'),
    roles           text[]      NOT NULL,
    chains          bigint[]    NOT NULL,
    verify_others   boolean     NOT NULL,
    capabilities    text[]      NOT NULL,
    encryption_key  text        NOT NULL,
    registered_at   timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    last_seen       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX executors_seen ON executors (last_seen);

-- A task is visible to agents once its poster listed it (after the escrow is funded).
CREATE TABLE task_listings (
    chain_id        bigint      NOT NULL,
    escrow_address  text        NOT NULL,
    task_id         numeric(78) NOT NULL,
    task_hash       text        NOT NULL,
    poster          text        NOT NULL,
    listed_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (chain_id, escrow_address, task_id)
);

-- Briefs: a public one in clear; a private one as AES-GCM ciphertext whose keccak256 the
-- terms commit to (instructionsDigest), and its key wrapped to each allowed reader.
CREATE TABLE task_briefs (
    task_hash    text        PRIMARY KEY,
    private      boolean     NOT NULL,
    brief        text,
    ciphertext   bytea,
    created_at   timestamptz NOT NULL DEFAULT now(),
    CHECK ((private AND brief IS NULL AND ciphertext IS NOT NULL) OR (NOT private AND brief IS NOT NULL AND ciphertext IS NULL))
);

CREATE TABLE brief_keys (
    task_hash    text        NOT NULL REFERENCES task_briefs (task_hash),
    recipient    text        NOT NULL CHECK (recipient ~ '^0x[0-9a-f]{40}$'),
    wrapped      text        NOT NULL,
    PRIMARY KEY (task_hash, recipient)
);
