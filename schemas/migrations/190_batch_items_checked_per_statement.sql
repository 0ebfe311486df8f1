-- Settlement relayer: the one-live-slot rule of 140 for batch items, checked once per
-- statement instead of once per row. The sender stores a packed round's items with one
-- INSERT ... SELECT unnest(...); the per-row trigger ran its lookup (a PL/pgSQL call, two
-- index probes) for each item, 44 ms of a 300-verdict round in a profile of bench_relayer.
-- Same rule, same error: an item is refused when its verdict has another live slot (a
-- single send, or a batch item other than this row, the statement's own rows included).
-- Live: not lost, and not mined with a revert. The trigger on settlement_transactions
-- (single sends, one row per statement or few) stays per row.
CREATE FUNCTION settlement_refuse_second_live_item() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    verdict bigint;
BEGIN
    SELECT n.verdict_id INTO verdict
    FROM new_items n
    WHERE EXISTS (
        SELECT 1 FROM settlement_transactions t
        WHERE t.verdict_id = n.verdict_id AND t.kind = 'verdict' AND t.state <> 'lost'
          AND t.receipt_status IS DISTINCT FROM 0
    ) OR EXISTS (
        SELECT 1 FROM settlement_batch_items b
        JOIN settlement_transactions t USING (chain_id, sender, nonce)
        WHERE b.verdict_id = n.verdict_id AND t.kind = 'batch' AND t.state <> 'lost'
          AND t.receipt_status IS DISTINCT FROM 0
          AND (b.chain_id, b.sender, b.nonce, b.position) IS DISTINCT FROM (n.chain_id, n.sender, n.nonce, n.position)
    )
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'verdict % already has a live slot', verdict
            USING ERRCODE = 'unique_violation';
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER settlement_batch_items_one_live_slot ON settlement_batch_items;
CREATE TRIGGER settlement_batch_items_one_live_slot
    AFTER INSERT ON settlement_batch_items
    REFERENCING NEW TABLE AS new_items
    FOR EACH STATEMENT EXECUTE FUNCTION settlement_refuse_second_live_item();
