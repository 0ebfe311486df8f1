-- Settlement relayer, packing on by default: a verdict is in at most one live slot, whether
-- its own (kind 'verdict') or as an item of a batch. For single slots the partial unique
-- index of 005 enforces it; the rule spans two tables once batches exist, so a trigger
-- refuses the insert that would give a verdict a second live slot. Live: not lost, and not
-- mined with a revert (a verdict may then be queued again, e.g. after a key rotation).
CREATE FUNCTION settlement_refuse_second_live_slot() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    verdict bigint := NEW.verdict_id;
BEGIN
    IF verdict IS NULL THEN
        RETURN NEW;
    END IF;
    IF EXISTS (
        SELECT 1 FROM settlement_batch_items b
        JOIN settlement_transactions t USING (chain_id, sender, nonce)
        WHERE b.verdict_id = verdict AND t.kind = 'batch' AND t.state <> 'lost'
          AND t.receipt_status IS DISTINCT FROM 0
    ) OR (TG_TABLE_NAME = 'settlement_batch_items' AND EXISTS (
        SELECT 1 FROM settlement_transactions t
        WHERE t.verdict_id = verdict AND t.kind = 'verdict' AND t.state <> 'lost'
          AND t.receipt_status IS DISTINCT FROM 0
    )) THEN
        RAISE EXCEPTION 'verdict % already has a live slot', verdict
            USING ERRCODE = 'unique_violation';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER settlement_batch_items_one_live_slot
    BEFORE INSERT ON settlement_batch_items
    FOR EACH ROW EXECUTE FUNCTION settlement_refuse_second_live_slot();

CREATE TRIGGER settlement_transactions_one_live_slot
    BEFORE INSERT ON settlement_transactions
    FOR EACH ROW WHEN (NEW.kind = 'verdict')
    EXECUTE FUNCTION settlement_refuse_second_live_slot();
