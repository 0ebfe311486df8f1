-- Timer events the lifecycle consumer has published, so that a timer whose cause a reorg
-- retracts is retracted too, and one that comes back (A → B → A) is published again under
-- a new id. `live` is false once retracted; `generation` counts comebacks.
CREATE TABLE lifecycle_fired_timers (
    chain_id    bigint      NOT NULL,
    escrow      text        NOT NULL,
    task_id     numeric(78) NOT NULL,
    kind        text        NOT NULL CHECK (kind IN ('deadline_passed', 'appeal_window_closed', 'escalation_collectible')),
    at          bigint      NOT NULL,
    generation  integer     NOT NULL DEFAULT 0 CHECK (generation >= 0),
    live        boolean     NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (chain_id, escrow, task_id, kind, at)
);
CREATE INDEX lifecycle_fired_timers_live_idx ON lifecycle_fired_timers (chain_id, escrow, task_id) WHERE live;
