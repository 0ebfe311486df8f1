-- Settlement relayer: one transaction may carry several verdicts (`completeVerificationBatch`).
-- A slot (nonce) of kind 'batch' has no verdict_id of its own: its verdicts are its items, in
-- calldata order. A verdict is in at most one live slot: the sender only packs `queued`
-- verdicts and marks them `sent` in the transaction that stores the slot and its items.
ALTER TABLE settlement_transactions DROP CONSTRAINT IF EXISTS settlement_transactions_kind_check;
ALTER TABLE settlement_transactions
    ADD CONSTRAINT settlement_transactions_kind_check CHECK (kind IN ('verdict', 'filler', 'batch'));
ALTER TABLE settlement_tx_versions DROP CONSTRAINT IF EXISTS settlement_tx_versions_kind_check;
ALTER TABLE settlement_tx_versions
    ADD CONSTRAINT settlement_tx_versions_kind_check CHECK (kind IN ('verdict', 'filler', 'batch'));

CREATE TABLE settlement_batch_items (
    chain_id   bigint  NOT NULL,
    sender     text    NOT NULL,
    nonce      bigint  NOT NULL,
    position   integer NOT NULL CHECK (position >= 0),
    verdict_id bigint  NOT NULL REFERENCES settlement_verdicts (id),
    PRIMARY KEY (chain_id, sender, nonce, position),
    FOREIGN KEY (chain_id, sender, nonce) REFERENCES settlement_transactions (chain_id, sender, nonce)
);
CREATE INDEX settlement_batch_items_verdict_idx ON settlement_batch_items (verdict_id);
