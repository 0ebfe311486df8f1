-- Settlement relayer: the one-live-slot rule of 190 for batch items, as two joins instead of
-- two correlated EXISTS per new item. The EXISTS form ran one subplan per item, and the one
-- over batch items walked every live batch's items for each new item (on a table whose
-- statistics said "one live batch": 300 items x 6 live batches x 50 items = 90,000 rows
-- checked, 10 ms of a 300-verdict round, growing with the batches in flight). Joined, the
-- same check reads each table once (0.4 ms for the same round). Same rule, same error: an
-- item is refused when its verdict has another live slot (a single send, or a batch item
-- other than this row, the statement's own rows included). Live: not lost, and not mined
-- with a revert.
CREATE OR REPLACE FUNCTION settlement_refuse_second_live_item() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    verdict bigint;
BEGIN
    SELECT min(clash.verdict_id) INTO verdict
    FROM (
        SELECT t.verdict_id FROM settlement_transactions t
        WHERE t.verdict_id = ANY (ARRAY(SELECT verdict_id FROM new_items))
          AND t.kind = 'verdict' AND t.state <> 'lost' AND t.receipt_status IS DISTINCT FROM 0
        UNION ALL
        SELECT b.verdict_id FROM settlement_batch_items b
        JOIN new_items n ON n.verdict_id = b.verdict_id
        JOIN settlement_transactions t ON t.chain_id = b.chain_id AND t.sender = b.sender AND t.nonce = b.nonce
        WHERE b.verdict_id = ANY (ARRAY(SELECT verdict_id FROM new_items))
          AND t.kind = 'batch' AND t.state <> 'lost' AND t.receipt_status IS DISTINCT FROM 0
          AND (b.chain_id, b.sender, b.nonce, b.position) IS DISTINCT FROM (n.chain_id, n.sender, n.nonce, n.position)
    ) AS clash;
    -- The lowest clashing verdict is named: the same statement fails with the same message.
    IF verdict IS NOT NULL THEN RAISE EXCEPTION 'verdict % already has a live slot', verdict
        USING ERRCODE = 'unique_violation'; END IF;
    RETURN NULL;
END
$$;
