-- Escrow-wide role changes (MarketplaceVerifierChanged, ArbiterChanged) as the lifecycle
-- consumer saw them: the current holder of a role is its latest row by chain position; a
-- retraction deletes its row, which restores the previous holder. "What can whom do" uses
-- them to name the judge and the arbiter and to leave out calls a role overlap makes the
-- escrow refuse (relayer/lifecycle/roles.py).
CREATE TABLE escrow_role_events (
    event_id     text    PRIMARY KEY,
    chain_id     bigint  NOT NULL,
    escrow       text    NOT NULL,
    role         text    NOT NULL CHECK (role IN ('marketplace_verifier', 'arbiter')),
    address      text    NOT NULL,
    block_number bigint  NOT NULL,
    log_index    integer NOT NULL
);
CREATE INDEX escrow_role_events_latest_idx
    ON escrow_role_events (chain_id, escrow, role, block_number DESC, log_index DESC);
