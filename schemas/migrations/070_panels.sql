-- Dispute panels and calibration (seed 003, docs/panels.md). Values in [0, 1] are integers
-- in parts per million, shares in basis points, fees in integer token units. The
-- constraints carry the rules that must hold whatever the code does: three seats per round,
-- a verifier sits at most once per task (so a rerun has fresh verifiers), a rerun never
-- reruns, a round's fee entries sum to zero, one ruling per task.

-- The panel service's view of each task: its parties and its terms hash, from the events.
CREATE TABLE panel_tasks (
    chain_id   bigint      NOT NULL,
    escrow     text        NOT NULL CHECK (escrow ~ '^0x[0-9a-f]{40}$'),
    task_id    numeric(78) NOT NULL,
    poster     text,
    agent      text,
    task_hash  text,
    attempt    smallint    NOT NULL DEFAULT 0,
    PRIMARY KEY (chain_id, escrow, task_id)
);

-- The pool. Calibration is the draw weight; it never reaches 0 (floor 0.01).
CREATE TABLE panel_verifiers (
    address         text        PRIMARY KEY CHECK (address ~ '^0x[0-9a-f]{40}$'),
    operator        text        NOT NULL CHECK (length(operator) BETWEEN 1 AND 64),
    chains          bigint[]    NOT NULL CHECK (cardinality(chains) BETWEEN 1 AND 64),
    calibration_ppm integer     NOT NULL DEFAULT 500000
                                CHECK (calibration_ppm BETWEEN 10000 AND 1000000),
    rounds          integer     NOT NULL DEFAULT 0 CHECK (rounds >= 0),
    active          boolean     NOT NULL DEFAULT true,
    registered_at   timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX panel_verifiers_operator_idx ON panel_verifiers (operator);

-- Posters are calibrated from sampled manual reviews; they start fully trusted.
CREATE TABLE panel_posters (
    address         text        PRIMARY KEY CHECK (address ~ '^0x[0-9a-f]{40}$'),
    calibration_ppm integer     NOT NULL DEFAULT 1000000
                                CHECK (calibration_ppm BETWEEN 10000 AND 1000000),
    rounds          integer     NOT NULL DEFAULT 0 CHECK (rounds >= 0),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- Drifting reviews in a row of one poster–agent pair (sampled at 100 % from 2).
CREATE TABLE panel_pair_drift (
    poster     text    NOT NULL CHECK (poster ~ '^0x[0-9a-f]{40}$'),
    agent      text    NOT NULL CHECK (agent ~ '^0x[0-9a-f]{40}$'),
    streak     integer NOT NULL DEFAULT 0 CHECK (streak >= 0),
    PRIMARY KEY (poster, agent)
);

-- One row per round. The draw (seats) is recorded when the round opens, so it can be
-- audited afterwards with `escrowd panel draw` and the secret of `secret_version`.
CREATE TABLE panel_rounds (
    round_id        text        PRIMARY KEY,
    chain_id        bigint      NOT NULL,
    escrow          text        NOT NULL CHECK (escrow ~ '^0x[0-9a-f]{40}$'),
    task_id         numeric(78) NOT NULL CHECK (task_id >= 1),
    reason          text        NOT NULL CHECK (reason IN ('dispute', 'review_sample')),
    round           smallint    NOT NULL CHECK (round IN (1, 2)),
    rerun_of        text        REFERENCES panel_rounds (round_id),
    secret_version  text        NOT NULL,
    status          text        NOT NULL CHECK (status IN ('open', 'closed')),
    -- retracted: the dispute event was removed by a reorg before the round closed;
    -- superseded: the human arbiter resolved the dispute before the panel did.
    outcome         text        CHECK (outcome IN ('ruling', 'rerun', 'inconclusive', 'pool_too_small', 'retracted',
                                                   'superseded')),
    consensus_ppm   integer     CHECK (consensus_ppm BETWEEN 0 AND 1000000),
    spread_ppm      integer     CHECK (spread_ppm BETWEEN 0 AND 1000000),
    schema_ok       boolean,
    agent_share_bps integer     CHECK (agent_share_bps BETWEEN 0 AND 10000),
    drawn_at        timestamptz NOT NULL DEFAULT now(),
    deadline        timestamptz NOT NULL,
    closed_at       timestamptz,
    -- The poster's review (approve = true) of a sampled review; never shown to verifiers.
    claim_passed    boolean,
    UNIQUE (chain_id, escrow, task_id, reason, round),
    CHECK ((reason = 'review_sample') = (claim_passed IS NOT NULL)),
    -- The rerun names the round it reruns; only round 2 does.
    CHECK ((round = 2) = (rerun_of IS NOT NULL)),
    -- A rerun never reruns.
    CHECK (round = 1 OR outcome IS DISTINCT FROM 'rerun'),
    -- Closed exactly when an outcome is recorded.
    CHECK ((status = 'closed') = (outcome IS NOT NULL)),
    CHECK ((status = 'closed') = (closed_at IS NOT NULL)),
    -- A ruling carries its consensus and split; an inconclusive round carries neither.
    CHECK (outcome IS DISTINCT FROM 'ruling' OR (consensus_ppm IS NOT NULL AND agent_share_bps IS NOT NULL)),
    CHECK (outcome NOT IN ('inconclusive', 'pool_too_small', 'retracted', 'superseded') OR (consensus_ppm IS NULL AND agent_share_bps IS NULL)),
    CHECK (deadline >= drawn_at)
);
CREATE INDEX panel_rounds_open_idx ON panel_rounds (deadline) WHERE status = 'open';

-- Seats: who was drawn and what each attested. A seat with no attestation by the deadline
-- is closed as timed out (confidence 0: no weight, no fee).
CREATE TABLE panel_seats (
    round_id        text        NOT NULL REFERENCES panel_rounds (round_id),
    seat            smallint    NOT NULL CHECK (seat BETWEEN 0 AND 2),
    chain_id        bigint      NOT NULL,
    escrow          text        NOT NULL,
    task_id         numeric(78) NOT NULL,
    reason          text        NOT NULL,
    verifier        text        NOT NULL REFERENCES panel_verifiers (address),
    calibration_ppm integer     NOT NULL CHECK (calibration_ppm BETWEEN 10000 AND 1000000),
    quality_ppm     integer     CHECK (quality_ppm BETWEEN 0 AND 1000000),
    confidence_ppm  integer     CHECK (confidence_ppm BETWEEN 0 AND 1000000),
    signature       text        CHECK (signature ~ '^0x[0-9a-f]{130}$'),
    attested_at     timestamptz,
    timed_out       boolean     NOT NULL DEFAULT false,
    PRIMARY KEY (round_id, seat),
    UNIQUE (round_id, verifier),
    -- Fresh verifiers on a rerun: a verifier sits at most once per task (dispute or sample).
    UNIQUE (chain_id, escrow, task_id, verifier),
    -- An attestation is whole (quality, confidence, signature, time) or absent.
    CHECK ((attested_at IS NULL) = (signature IS NULL)
           AND (attested_at IS NULL) = (quality_ppm IS NULL)
           AND (attested_at IS NULL) = (confidence_ppm IS NULL)),
    -- A timed-out seat never attested.
    CHECK (NOT timed_out OR attested_at IS NULL)
);

-- Rulings for the relayer: one per task, written before anything is signed or sent.
CREATE TABLE panel_rulings (
    chain_id        bigint      NOT NULL,
    escrow          text        NOT NULL,
    task_id         numeric(78) NOT NULL,
    round_id        text        NOT NULL UNIQUE REFERENCES panel_rounds (round_id),
    agent_share_bps integer     NOT NULL CHECK (agent_share_bps BETWEEN 0 AND 10000),
    signer          text        NOT NULL,
    signature       text        NOT NULL CHECK (signature ~ '^0x[0-9a-f]{130}$'),
    status          text        NOT NULL DEFAULT 'queued'
                                CHECK (status IN ('queued', 'sent', 'confirmed', 'reverted', 'already_resolved')),
    tx_hash         text,
    error           text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (chain_id, escrow, task_id)
);

-- The fee ledger: integer token units; every round's entries sum to zero (checked at commit).
CREATE TABLE panel_fee_ledger (
    entry_id    text        PRIMARY KEY,
    round_id    text        NOT NULL REFERENCES panel_rounds (round_id),
    chain_id    bigint      NOT NULL,
    account     text        NOT NULL CHECK (account ~ '^0x[0-9a-f]{40}$'),
    role        text        NOT NULL CHECK (role IN ('verifier', 'poster', 'agent')),
    delta_units numeric(78) NOT NULL CHECK (delta_units <> 0),
    reason      text        NOT NULL CHECK (reason IN ('attestation_fee', 'panel_fee')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (round_id, account, reason),
    CHECK ((reason = 'attestation_fee') = (role = 'verifier' AND delta_units > 0)),
    CHECK ((reason = 'panel_fee') = (role <> 'verifier' AND delta_units < 0))
);

CREATE FUNCTION panel_fee_ledger_balanced() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT coalesce(sum(delta_units), 0) FROM panel_fee_ledger WHERE round_id = NEW.round_id) <> 0 THEN
        RAISE EXCEPTION 'fee ledger of round % does not sum to zero', NEW.round_id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NULL;
END;
$$;

CREATE CONSTRAINT TRIGGER panel_fee_ledger_balanced
    AFTER INSERT OR UPDATE ON panel_fee_ledger
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION panel_fee_ledger_balanced();

-- Only weighted seats earn: an attestation fee needs an attested seat with confidence > 0.
CREATE FUNCTION panel_fee_needs_weight() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.reason = 'attestation_fee' AND NOT EXISTS (
        SELECT 1 FROM panel_seats
        WHERE round_id = NEW.round_id AND verifier = NEW.account
          AND NOT timed_out AND confidence_ppm > 0
    ) THEN
        RAISE EXCEPTION 'no weighted seat of % in round %', NEW.account, NEW.round_id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER panel_fee_needs_weight
    BEFORE INSERT OR UPDATE ON panel_fee_ledger
    FOR EACH ROW EXECUTE FUNCTION panel_fee_needs_weight();

-- The settlement relayer's side of rulings: one per task, written (from a trusted, signed
-- ruling) before anything is signed; the raw transaction is stored with its nonce before it
-- is broadcast, so a crash re-broadcasts it and never signs a second one.
CREATE TABLE settlement_rulings (
    chain_id        bigint      NOT NULL,
    escrow          text        NOT NULL CHECK (escrow ~ '^0x[0-9a-f]{40}$'),
    task_id         numeric(78) NOT NULL,
    round           smallint    NOT NULL CHECK (round IN (1, 2)),
    agent_share_bps integer     NOT NULL CHECK (agent_share_bps BETWEEN 0 AND 10000),
    message_id      text        NOT NULL,
    signer          text        NOT NULL,
    signed_ruling   jsonb       NOT NULL,
    status          text        NOT NULL DEFAULT 'queued'
                                CHECK (status IN ('queued', 'sent', 'confirmed', 'already_resolved', 'reverted')),
    error           text,
    nonce           bigint      CHECK (nonce >= 0),
    raw_tx          text,
    tx_hash         text        UNIQUE,
    block_number    bigint,
    created_at      timestamptz NOT NULL DEFAULT now(),
    sent_at         timestamptz,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (chain_id, escrow, task_id),
    CHECK ((nonce IS NULL) = (raw_tx IS NULL) AND (nonce IS NULL) = (tx_hash IS NULL)),
    CHECK (status NOT IN ('sent', 'confirmed') OR nonce IS NOT NULL)
);
