-- The ruling path sends through the one transaction sender (chain/sender.py): a ruling's
-- transaction is a slot of kind 'ruling' in settlement_transactions (one row per nonce of the
-- arbiter key) with its signed versions in settlement_tx_versions, like verdicts, batches and
-- the verifier agent's calls. settlement_ruling_slots links a nonce to the ruling it carries,
-- as settlement_batch_items links a batch nonce to its verdicts. The invariants the 110/120
-- triggers kept on settlement_ruling_txs move onto these tables (docs/panels.md, "Sending a
-- ruling"); settlement_ruling_txs stays readable, as a view with its columns.
ALTER TABLE settlement_transactions DROP CONSTRAINT IF EXISTS settlement_transactions_kind_check;
ALTER TABLE settlement_transactions
    ADD CONSTRAINT settlement_transactions_kind_check CHECK (kind IN ('verdict', 'filler', 'batch', 'call', 'ruling'));
ALTER TABLE settlement_tx_versions DROP CONSTRAINT IF EXISTS settlement_tx_versions_kind_check;
ALTER TABLE settlement_tx_versions
    ADD CONSTRAINT settlement_tx_versions_kind_check CHECK (kind IN ('verdict', 'filler', 'batch', 'call', 'ruling'));

-- One row per nonce that carried a ruling. A ruling has several only when another transaction
-- of the arbiter key took a nonce of it (that slot is 'lost') and it was sent again. The slot
-- is stored after the link in the same transaction (the version trigger below reads the link),
-- so the foreign key to it is checked at commit.
CREATE TABLE settlement_ruling_slots (
    chain_id   bigint      NOT NULL,
    sender     text        NOT NULL,
    nonce      bigint      NOT NULL CHECK (nonce >= 0),
    escrow     text        NOT NULL,
    task_id    numeric(78) NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (chain_id, sender, nonce),
    FOREIGN KEY (chain_id, sender, nonce) REFERENCES settlement_transactions (chain_id, sender, nonce)
        DEFERRABLE INITIALLY DEFERRED,
    FOREIGN KEY (chain_id, escrow, task_id) REFERENCES settlement_rulings (chain_id, escrow, task_id)
);
CREATE INDEX settlement_ruling_slots_ruling_idx ON settlement_ruling_slots (chain_id, escrow, task_id);

-- One live nonce per ruling: a ruling is linked to a new nonce only while it is being sent at
-- that nonce, and only when every nonce it had before was taken by another transaction.
CREATE FUNCTION settlement_ruling_slots_one_live() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM settlement_rulings r
        WHERE r.chain_id = NEW.chain_id AND r.escrow = NEW.escrow AND r.task_id = NEW.task_id
          AND r.nonce = NEW.nonce AND r.status = 'sent'
    ) THEN
        RAISE EXCEPTION 'ruling % on chain %: a nonce is linked only as the ruling''s live nonce while it is sent',
            NEW.task_id, NEW.chain_id;
    END IF;
    IF EXISTS (
        SELECT 1 FROM settlement_ruling_slots l
        JOIN settlement_transactions t USING (chain_id, sender, nonce)
        WHERE l.chain_id = NEW.chain_id AND l.escrow = NEW.escrow AND l.task_id = NEW.task_id
          AND t.state <> 'lost'
    ) THEN
        RAISE EXCEPTION 'ruling % on chain %: it has a live nonce already', NEW.task_id, NEW.chain_id
            USING ERRCODE = 'unique_violation';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER settlement_ruling_slots_one_live
    BEFORE INSERT ON settlement_ruling_slots
    FOR EACH ROW EXECUTE FUNCTION settlement_ruling_slots_one_live();

CREATE FUNCTION settlement_ruling_slots_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'settlement_ruling_slots is append-only: a nonce keeps the ruling it carried';
END
$$;

CREATE TRIGGER settlement_ruling_slots_append_only
    BEFORE UPDATE OR DELETE ON settlement_ruling_slots
    FOR EACH ROW EXECUTE FUNCTION settlement_ruling_slots_append_only();

-- A ruling's version is signed only at its live nonce while it is being sent (as 110/120 did
-- on settlement_ruling_txs): never for a ruling confirmed, reverted or final.
CREATE FUNCTION settlement_tx_versions_ruling_live_nonce() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM settlement_ruling_slots l
        JOIN settlement_rulings r ON r.chain_id = l.chain_id AND r.escrow = l.escrow AND r.task_id = l.task_id
        WHERE l.chain_id = NEW.chain_id AND l.sender = NEW.sender AND l.nonce = NEW.nonce
          AND r.nonce = NEW.nonce AND r.status = 'sent'
    ) THEN
        RAISE EXCEPTION 'nonce % on chain %: a ruling''s transaction version must use the ruling''s live nonce while it is sent',
            NEW.nonce, NEW.chain_id;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER settlement_tx_versions_ruling_live_nonce
    BEFORE INSERT ON settlement_tx_versions
    FOR EACH ROW WHEN (NEW.kind = 'ruling')
    EXECUTE FUNCTION settlement_tx_versions_ruling_live_nonce();

-- A ruling's signed versions are kept as signed (a receipt for any of them counts): only the
-- informational first-broadcast time may be filled in.
CREATE FUNCTION settlement_tx_versions_ruling_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' OR (NEW.tx_hash, NEW.chain_id, NEW.sender, NEW.nonce, NEW.version, NEW.kind, NEW.raw_tx,
            NEW.max_fee_per_gas, NEW.max_priority_fee_per_gas, NEW.gas_limit, NEW.created_at)
            IS DISTINCT FROM (OLD.tx_hash, OLD.chain_id, OLD.sender, OLD.nonce, OLD.version, OLD.kind, OLD.raw_tx,
            OLD.max_fee_per_gas, OLD.max_priority_fee_per_gas, OLD.gas_limit, OLD.created_at) THEN
        RAISE EXCEPTION 'a ruling''s transaction versions are append-only: a signed version is kept as it was signed';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER settlement_tx_versions_ruling_append_only
    BEFORE UPDATE OR DELETE ON settlement_tx_versions
    FOR EACH ROW WHEN (OLD.kind = 'ruling')
    EXECUTE FUNCTION settlement_tx_versions_ruling_append_only();

-- The versions signed before this migration. Their table does not name the arbiter key's
-- address (the sender's tables are keyed by it), so SQL cannot move them: the table is kept
-- as it is, under another name, with its append-only trigger, and the sender adopts the live
-- nonce of each ruling still followed when it starts (RulingSender._adopt_legacy). The view
-- shows every version once: the sender's copy when adopted, the old row otherwise.
ALTER TABLE settlement_ruling_txs RENAME TO settlement_ruling_txs_before_230;
DROP TRIGGER settlement_ruling_txs_live_nonce ON settlement_ruling_txs_before_230;
CREATE TRIGGER settlement_ruling_txs_before_230_frozen
    BEFORE INSERT ON settlement_ruling_txs_before_230
    FOR EACH ROW EXECUTE FUNCTION settlement_ruling_txs_append_only();

-- Versions start at 0 in the sender's tables and started at 1 here: the view keeps the old
-- numbering, so operators' queries and the docs read the same numbers as before.
CREATE VIEW settlement_ruling_txs AS
SELECT l.chain_id, l.escrow, l.task_id, v.nonce, v.version + 1 AS version, v.tx_hash, v.raw_tx, v.gas_limit,
       v.max_fee_per_gas, v.max_priority_fee_per_gas, v.created_at
FROM settlement_ruling_slots l
JOIN settlement_tx_versions v ON v.chain_id = l.chain_id AND v.sender = l.sender AND v.nonce = l.nonce
WHERE v.kind = 'ruling'
UNION ALL
SELECT o.chain_id, o.escrow, o.task_id, o.nonce, o.version, o.tx_hash, o.raw_tx, o.gas_limit,
       o.max_fee_per_gas, o.max_priority_fee_per_gas, o.created_at
FROM settlement_ruling_txs_before_230 o
WHERE NOT EXISTS (SELECT 1 FROM settlement_tx_versions v WHERE v.tx_hash = o.tx_hash);
