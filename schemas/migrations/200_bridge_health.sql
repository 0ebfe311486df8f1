-- Bridge health as the relayer sees it: its health monitor writes one row per chain after
-- every check (the key it signs with, the escrow's verifier, whether its send gate is open
-- and why, the indexer's lag), so the API's `/health/bridge` serves the relayer's answer
-- instead of computing its own from a configured address. `checked_at` is the database's
-- clock, which the reader compares with `stale_after_seconds`: a relayer that stopped
-- reporting reads as failing, never as its last good report.
CREATE TABLE bridge_health (
    chain_id            bigint           PRIMARY KEY,
    relayer_address     text             NOT NULL,
    report              jsonb            NOT NULL,
    checked_at          timestamptz      NOT NULL DEFAULT now(),
    stale_after_seconds double precision NOT NULL CHECK (stale_after_seconds > 0)
);
