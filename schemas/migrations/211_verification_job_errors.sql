-- A judge that raises an unexpected error (a bug, the database refusing the commit: our
-- fault, never the agent's) is retried a bounded number of times with a backoff, then the job
-- is parked as `failed`: no verdict, no zero, no FAIL; an alert asks an operator to look and
-- queue it again (docs/operations.md, "Judging backlog and expired leases").
ALTER TABLE verification_jobs DROP CONSTRAINT verification_jobs_state_check;
ALTER TABLE verification_jobs ADD CONSTRAINT verification_jobs_state_check
    CHECK (state IN ('queued', 'judging', 'done', 'dropped', 'failed'));
-- Unexpected errors of this job so far, and the earliest instant it may be claimed again.
ALTER TABLE verification_jobs ADD COLUMN errors integer NOT NULL DEFAULT 0;
ALTER TABLE verification_jobs ADD COLUMN not_before timestamptz;
-- The failed-jobs gauge counts these once a poll interval.
CREATE INDEX verification_jobs_failed_idx ON verification_jobs (seq) WHERE state = 'failed';
