-- The ruling path replaces a stuck transaction with the same nonce and bumped fees, and keeps
-- watching a confirmed ruling until it is final (docs/panels.md, "Sending a ruling").
--
-- settlement_ruling_txs: every version of a ruling's transaction that was signed, stored before
-- it is broadcast. A receipt for any of them counts. All versions of one nonce are
-- replacements of each other, so at most one of them can be mined.
CREATE TABLE settlement_ruling_txs (
    chain_id                 bigint      NOT NULL,
    escrow                   text        NOT NULL,
    task_id                  numeric(78) NOT NULL,
    nonce                    bigint      NOT NULL CHECK (nonce >= 0),
    version                  integer     NOT NULL CHECK (version >= 1),
    tx_hash                  text        NOT NULL UNIQUE,
    raw_tx                   text        NOT NULL,
    gas_limit                bigint      NOT NULL CHECK (gas_limit > 0),
    max_fee_per_gas          numeric(78) NOT NULL CHECK (max_fee_per_gas >= 0),
    max_priority_fee_per_gas numeric(78) NOT NULL CHECK (max_priority_fee_per_gas >= 0
                                                         AND max_priority_fee_per_gas <= max_fee_per_gas),
    created_at               timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (chain_id, escrow, task_id, nonce, version),
    FOREIGN KEY (chain_id, escrow, task_id) REFERENCES settlement_rulings (chain_id, escrow, task_id)
);

-- The ruling row keeps the live version (tx_hash, raw_tx), when it was last broadcast or
-- replaced, the block hash its receipt was seen in, how often a reorg took it away, and when
-- it became final (finality depth reached: no longer watched).
ALTER TABLE settlement_rulings
    ADD COLUMN broadcast_at timestamptz,
    ADD COLUMN block_hash   text,
    ADD COLUMN reorgs       integer NOT NULL DEFAULT 0 CHECK (reorgs >= 0),
    ADD COLUMN final_at     timestamptz,
    ADD CONSTRAINT settlement_rulings_final_confirmed CHECK (final_at IS NULL OR status = 'confirmed');

-- Rows sent before this migration: their one transaction becomes version 1. Its fees were not
-- recorded (0 here): a first bump is priced at the market, and if the node finds that too low a
-- replacement the next bump raises it again. The gas limit is the send path's default.
INSERT INTO settlement_ruling_txs (chain_id, escrow, task_id, nonce, version, tx_hash, raw_tx, gas_limit,
                                   max_fee_per_gas, max_priority_fee_per_gas)
SELECT chain_id, escrow, task_id, nonce, 1, tx_hash, raw_tx, 200000, 0, 0
FROM settlement_rulings WHERE tx_hash IS NOT NULL;
UPDATE settlement_rulings SET broadcast_at = COALESCE(sent_at, now()) WHERE tx_hash IS NOT NULL;
-- Confirmed before this migration: their depth was checked once; the watch resumes.

-- Never two different nonces for one ruling at once: a version is stored only at the ruling's
-- live nonce. The sender gives a ruling a fresh nonce only after its old one was taken by
-- another transaction of the arbiter key (and none of the ruling's versions was mined).
CREATE FUNCTION settlement_ruling_txs_live_nonce() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM settlement_rulings r
        WHERE r.chain_id = NEW.chain_id AND r.escrow = NEW.escrow AND r.task_id = NEW.task_id
          AND r.nonce = NEW.nonce
    ) THEN
        RAISE EXCEPTION 'ruling % on chain %: a transaction version must use the ruling''s live nonce',
            NEW.task_id, NEW.chain_id;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER settlement_ruling_txs_live_nonce
    BEFORE INSERT ON settlement_ruling_txs
    FOR EACH ROW EXECUTE FUNCTION settlement_ruling_txs_live_nonce();
