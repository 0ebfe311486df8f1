-- Lifecycle and reputation consumers: the events each folds, and the derived state.

-- Task events the lifecycle consumer has applied (a retraction deletes its row; the task is
-- then refolded from what remains).
CREATE TABLE lifecycle_events (
    event_id        text        PRIMARY KEY,
    chain_id        bigint      NOT NULL,
    escrow          text        NOT NULL,
    task_id         numeric(78) NOT NULL,
    block_number    bigint      NOT NULL,
    log_index       integer     NOT NULL,
    message         jsonb       NOT NULL
);
CREATE INDEX lifecycle_events_task_idx ON lifecycle_events (chain_id, escrow, task_id);

CREATE TABLE task_states (
    chain_id       bigint      NOT NULL,
    escrow         text        NOT NULL,
    task_id        numeric(78) NOT NULL,
    status         smallint    NOT NULL CHECK (status BETWEEN 0 AND 9),
    state          jsonb       NOT NULL,
    -- Earliest pending timer (chain time), for the timer sweep; null when none is pending.
    next_timer_at  bigint,
    -- Partition of the task's key, so a consumer member sweeps only the tasks it owns.
    kafka_partition integer    NOT NULL,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (chain_id, escrow, task_id)
);
CREATE INDEX task_states_timer_idx ON task_states (next_timer_at) WHERE next_timer_at IS NOT NULL;

-- Verdicts as they count for reputation (a retraction deletes the row; the agent is refolded).
CREATE TABLE reputation_outcomes (
    event_id        text        PRIMARY KEY,
    agent           text        NOT NULL,
    passed          boolean     NOT NULL,
    chain_id        bigint      NOT NULL,
    escrow          text        NOT NULL,
    task_id         numeric(78) NOT NULL,
    attempt         smallint    NOT NULL CHECK (attempt BETWEEN 1 AND 3),
    block_number    bigint      NOT NULL,
    log_index       integer     NOT NULL,
    block_timestamp bigint      NOT NULL
);
CREATE INDEX reputation_outcomes_agent_idx ON reputation_outcomes (agent);

CREATE TABLE agent_reputation (
    agent          text        PRIMARY KEY,
    score          smallint    NOT NULL CHECK (score BETWEEN 0 AND 100),
    dispute_count  integer     NOT NULL CHECK (dispute_count >= 0),
    passes         integer     NOT NULL CHECK (passes >= 0),
    failures       integer     NOT NULL CHECK (failures >= 0),
    matching_score double precision NOT NULL,
    updated_at     timestamptz NOT NULL DEFAULT now()
);
