-- The indexer's events table is the log itself: one durable write per event.
--
-- Each `escrow_events` row gets a position, per chain, assigned inside the indexer's
-- transaction from a counter on the chain's cursor row (`chain_cursor.log_position`, the
-- last position handed out). The counter's row lock is held until commit, so positions
-- become visible in commit order: a reader that sees position p committed sees every
-- lower position committed or deleted. Deleted rows (a reorg) leave gaps; nothing needs
-- positions to be dense.
--
-- A reorg's retractions are rows of the same log (`escrow_event_retractions`, positions
-- from the same counter). The publisher keeps one row per chain (`event_log_watermarks`):
-- `published_through` (every position up to it is on Kafka) and `sending_through` (the
-- highest position whose send was attempted: recorded, and committed, before the send).

ALTER TABLE chain_cursor ADD COLUMN log_position bigint NOT NULL DEFAULT 0 CHECK (log_position >= 0);
-- The topic the chain's log is published to (the indexer writes it with the cursor).
ALTER TABLE chain_cursor ADD COLUMN topic text;

ALTER TABLE escrow_events ADD COLUMN position bigint;
UPDATE escrow_events e SET position = p.position
FROM (
    SELECT event_id, row_number() OVER (PARTITION BY chain_id ORDER BY block_number, log_index) AS position
    FROM escrow_events
) p
WHERE p.event_id = e.event_id;
ALTER TABLE escrow_events ALTER COLUMN position SET NOT NULL;
UPDATE chain_cursor c SET log_position = COALESCE(
    (SELECT max(position) FROM escrow_events e WHERE e.chain_id = c.chain_id), 0);
UPDATE chain_cursor c SET topic = (
    SELECT o.topic FROM outbox o WHERE o.chain_id = c.chain_id AND o.event_id IS NOT NULL
    ORDER BY o.seq DESC LIMIT 1);

-- The hot table keeps three index entries per row (was four): the id (uniqueness: an event
-- is stored once), the log order (the publisher, reorg rollbacks), the task (readers).
-- `(chain_id, block_hash, log_index)` repeated the id; `(chain_id, block_number)` is served
-- by the log order, in which block numbers never decrease.
ALTER TABLE escrow_events DROP CONSTRAINT escrow_events_chain_id_block_hash_log_index_key;
DROP INDEX escrow_events_block_idx;
CREATE UNIQUE INDEX escrow_events_log_idx ON escrow_events (chain_id, position);

CREATE TABLE escrow_event_retractions (
    chain_id        bigint  NOT NULL,
    position        bigint  NOT NULL,
    -- The message id the retracted event was published under (`<event id>` or `<event id>#<n>`).
    retracted_as    text    NOT NULL,
    event_id        text    NOT NULL,
    escrow_address  text    NOT NULL,
    block_number    bigint  NOT NULL,
    block_hash      text    NOT NULL,
    block_timestamp bigint  NOT NULL,
    tx_hash         text    NOT NULL,
    tx_index        integer NOT NULL,
    log_index       integer NOT NULL,
    event_name      text    NOT NULL,
    task_id         numeric(78),
    args            jsonb   NOT NULL,
    PRIMARY KEY (chain_id, position)
);

CREATE TABLE event_log_watermarks (
    chain_id          bigint      PRIMARY KEY,
    published_through bigint      NOT NULL DEFAULT 0,
    sending_through   bigint      NOT NULL DEFAULT 0,
    updated_at        timestamptz NOT NULL DEFAULT now(),
    CHECK (sending_through >= published_through)
);

-- Hand-over from the per-event outbox rows: events whose outbox row is published are
-- behind the watermark; from the first one whose row is not, the log publishes them under
-- the same message ids (`<event id>#<n>` from `event_retractions`, as before). Rows whose
-- send was attempted are behind `sending_through`, so a reorg still retracts them.
INSERT INTO event_log_watermarks (chain_id, published_through, sending_through)
SELECT chain_id, published, GREATEST(published, attempted) FROM (
    SELECT c.chain_id,
           COALESCE((SELECT min(e.position) - 1 FROM escrow_events e JOIN outbox o
                     ON o.event_id = e.event_id AND o.published_at IS NULL AND o.message_id NOT LIKE '%:removed'
                     WHERE e.chain_id = c.chain_id), c.log_position) AS published,
           COALESCE((SELECT max(e.position) FROM escrow_events e JOIN outbox o
                     ON o.event_id = e.event_id AND o.send_attempts > 0 AND o.message_id NOT LIKE '%:removed'
                     WHERE e.chain_id = c.chain_id), 0) AS attempted
    FROM chain_cursor c
) handed_over;
DELETE FROM outbox o WHERE o.event_id IS NOT NULL AND o.published_at IS NULL AND o.message_id NOT LIKE '%:removed'
    AND EXISTS (SELECT 1 FROM escrow_events e WHERE e.event_id = o.event_id);

-- Every live log row as the message it is published as, and where it stands: 'published'
-- (behind the watermark), 'sending' (its send was attempted, the watermark not moved yet)
-- or 'pending'. For operators and tests; the publisher reads the tables directly.
CREATE VIEW event_log_messages AS
SELECT l.chain_id, l.position, l.event_id, l.message_id, l.block_number,
       CASE WHEN l.position <= COALESCE(w.published_through, 0) THEN 'published'
            WHEN l.position <= COALESCE(w.sending_through, 0) THEN 'sending'
            ELSE 'pending' END AS state
FROM (
    SELECT e.chain_id, e.position, e.event_id, e.block_number,
           CASE WHEN r.retractions IS NULL THEN e.event_id ELSE e.event_id || '#' || r.retractions END AS message_id
    FROM escrow_events e LEFT JOIN event_retractions r ON r.event_id = e.event_id
    UNION ALL
    SELECT x.chain_id, x.position, x.event_id, NULL::bigint, x.retracted_as || ':removed'
    FROM escrow_event_retractions x
) l
LEFT JOIN event_log_watermarks w ON w.chain_id = l.chain_id;
