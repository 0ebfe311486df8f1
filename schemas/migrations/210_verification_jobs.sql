-- Judging as its own stage: the verification consumer records each judgement it decides on
-- as a claimable job (in the transaction that consumes the message) and moves on; a judging
-- pool claims jobs with a lease, judges outside any transaction and commits the verdict in
-- a short one. One row per (request, try): a redelivered message or a reconciliation that
-- decides the same judgement again finds the row and adds nothing.
CREATE TABLE verification_jobs (
    seq             bigserial   PRIMARY KEY,
    request_id      text        NOT NULL,
    retry_count     integer     NOT NULL,
    chain_id        bigint      NOT NULL,
    escrow_address  text        NOT NULL,
    task_id         numeric(78) NOT NULL,
    attempt         smallint    NOT NULL,
    evidence_hash   text        NOT NULL,
    verifier        text        NOT NULL,
    state           text        NOT NULL DEFAULT 'queued'
                    CHECK (state IN ('queued', 'judging', 'done', 'dropped')),
    claim_token     text,
    lease_until     timestamptz,
    claims          integer     NOT NULL DEFAULT 0,
    expiries        integer     NOT NULL DEFAULT 0,
    outcome         text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (request_id, retry_count)
);
-- The claim scans open jobs in order, and looks for an earlier open job of the same task.
CREATE INDEX verification_jobs_open_idx ON verification_jobs (seq) WHERE state IN ('queued', 'judging');
CREATE INDEX verification_jobs_task_open_idx
    ON verification_jobs (chain_id, escrow_address, task_id, seq) WHERE state IN ('queued', 'judging');
-- Finished jobs are pruned by age (docs/operations.md): the verdict itself lives in verification_results.
CREATE INDEX verification_jobs_finished_idx ON verification_jobs (updated_at) WHERE state IN ('done', 'dropped');
