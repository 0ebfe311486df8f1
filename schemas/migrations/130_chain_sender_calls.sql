-- One transaction sender (chain/sender.py) for every key: besides the relayer's verdicts,
-- batches and fillers, a slot may hold a plain contract call (kind 'call': the hosted
-- verifier agent's completeVerification from its own wallet). A call slot keeps its target
-- and calldata, so a replacement (same nonce, higher fees) re-signs exactly the same call:
-- one calldata per nonce. A filler replacing a call keeps them (the call it cancelled).
ALTER TABLE settlement_transactions
    ADD COLUMN to_address text CHECK (to_address IS NULL OR to_address ~ '^0x[0-9a-f]{40}$'),
    ADD COLUMN calldata   bytea CHECK (calldata IS NULL OR octet_length(calldata) <= 131072);
ALTER TABLE settlement_transactions DROP CONSTRAINT IF EXISTS settlement_transactions_kind_check;
ALTER TABLE settlement_transactions
    ADD CONSTRAINT settlement_transactions_kind_check CHECK (kind IN ('verdict', 'filler', 'batch', 'call'));
ALTER TABLE settlement_transactions
    ADD CONSTRAINT settlement_transactions_call_has_its_call
        CHECK (kind <> 'call' OR (to_address IS NOT NULL AND calldata IS NOT NULL AND verdict_id IS NULL));
ALTER TABLE settlement_tx_versions DROP CONSTRAINT IF EXISTS settlement_tx_versions_kind_check;
ALTER TABLE settlement_tx_versions
    ADD CONSTRAINT settlement_tx_versions_kind_check CHECK (kind IN ('verdict', 'filler', 'batch', 'call'));
