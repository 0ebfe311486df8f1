-- Review of the ruling path (docs/panels.md, "Review").
--
-- A ruling whose transaction was mined but reverted (`reverted`, `already_resolved`) is watched
-- to the finality depth like a confirmed one: a reorg can take a reverted transaction away and
-- free its nonce, and an unused nonce is a gap every later ruling of the key waits behind. So
-- `final_at` may now be set on those outcomes too; never on a ruling without a transaction
-- (a preflight refusal is not on chain: nothing to watch). Rows recorded before this
-- migration are not marked final here: the sender's next pass reads their receipts and marks
-- them final when they are deep enough, or sends them again when their block is gone.
ALTER TABLE settlement_rulings
    DROP CONSTRAINT settlement_rulings_final_confirmed,
    ADD CONSTRAINT settlement_rulings_final_mined
        CHECK (final_at IS NULL OR (status IN ('confirmed', 'reverted', 'already_resolved') AND tx_hash IS NOT NULL));

-- What the sender promises, enforced where every writer must pass:
-- - a final ruling never changes again (not sent again, not given another nonce or transaction);
-- - a ruling's nonce changes only to or from NULL (queued again after another transaction of
--   the key took it) or to a nonce one of its stored versions has (that older version was
--   mined): never to a nonce nothing of this ruling was signed at.
CREATE FUNCTION settlement_rulings_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.final_at IS NOT NULL AND (NEW.status, NEW.nonce, NEW.tx_hash, NEW.raw_tx, NEW.block_hash, NEW.final_at)
            IS DISTINCT FROM (OLD.status, OLD.nonce, OLD.tx_hash, OLD.raw_tx, OLD.block_hash, OLD.final_at) THEN
        RAISE EXCEPTION 'ruling % on chain %: final, it does not change any more', OLD.task_id, OLD.chain_id;
    END IF;
    IF OLD.nonce IS NOT NULL AND NEW.nonce IS NOT NULL AND NEW.nonce <> OLD.nonce AND NOT EXISTS (
        SELECT 1 FROM settlement_ruling_txs t
        WHERE t.chain_id = NEW.chain_id AND t.escrow = NEW.escrow AND t.task_id = NEW.task_id
          AND t.nonce = NEW.nonce
    ) THEN
        RAISE EXCEPTION 'ruling % on chain %: nonce % has no stored version of this ruling',
            NEW.task_id, NEW.chain_id, NEW.nonce;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER settlement_rulings_guard
    BEFORE UPDATE ON settlement_rulings
    FOR EACH ROW EXECUTE FUNCTION settlement_rulings_guard();

-- A version is signed only for a ruling that is being sent (never for one that is confirmed,
-- reverted or final: a transaction replacing a mined one can never be mined, and after the
-- finality depth nothing is sent again), and only at its live nonce (as in 110).
CREATE OR REPLACE FUNCTION settlement_ruling_txs_live_nonce() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM settlement_rulings r
        WHERE r.chain_id = NEW.chain_id AND r.escrow = NEW.escrow AND r.task_id = NEW.task_id
          AND r.nonce = NEW.nonce AND r.status = 'sent'
    ) THEN
        RAISE EXCEPTION 'ruling % on chain %: a transaction version must use the ruling''s live nonce while it is sent',
            NEW.task_id, NEW.chain_id;
    END IF;
    RETURN NEW;
END
$$;

-- Every signed version is kept as signed: a receipt for any of them counts, so none may be
-- rewritten or dropped while the ruling is followed.
CREATE FUNCTION settlement_ruling_txs_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'settlement_ruling_txs is append-only: a signed version is kept as it was signed';
END
$$;

CREATE TRIGGER settlement_ruling_txs_append_only
    BEFORE UPDATE OR DELETE ON settlement_ruling_txs
    FOR EACH ROW EXECUTE FUNCTION settlement_ruling_txs_append_only();
