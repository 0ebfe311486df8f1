-- Retention: what lets the pruner (runtime/retention.py) delete rows that grow with traffic
-- without giving up exactly-once.
--
-- Each inbox row records where its message was first delivered (topic, partition, offset).
-- Before it deletes rows, the pruner raises `consumer_inbox_floors.pruned_through` of their
-- (consumer, topic, partition) to the highest offset it will delete, and it deletes only
-- offsets at or below a floor that has been visible for a settling time. The consumer refuses
-- a new inbox row for an offset at or below its partition's floor: a partition is consumed in
-- order, so every such offset was handled already, and a redelivered old message whose inbox
-- row is gone is still a duplicate. Rows written before this migration carry no offset and
-- are deleted by age alone (after the broker's retention, when no copy is left to deliver).

ALTER TABLE consumer_inbox ADD COLUMN topic text;
ALTER TABLE consumer_inbox ADD COLUMN partition integer;
ALTER TABLE consumer_inbox ADD COLUMN "offset" bigint;
-- Rows are appended in time order: a block range index finds the old ones for almost nothing
-- per insert (a B-tree would add a write to every message).
CREATE INDEX consumer_inbox_age_idx ON consumer_inbox USING brin (processed_at);

CREATE TABLE consumer_inbox_floors (
    consumer         text        NOT NULL,
    topic            text        NOT NULL,
    partition        integer     NOT NULL,
    -- Offsets at or below this were handled: the consumer treats them as duplicates.
    pruned_through   bigint      NOT NULL,
    raised_at        timestamptz NOT NULL DEFAULT now(),
    -- The value `pruned_through` had at least the settling time ago: the pruner deletes up to it.
    settled_through  bigint      NOT NULL DEFAULT -1,
    PRIMARY KEY (consumer, topic, partition)
);

-- Dead letters an operator has dealt with (replayed or judged final): deleted after an age.
ALTER TABLE dead_letters ADD COLUMN resolved_at timestamptz;
CREATE INDEX dead_letters_resolved_idx ON dead_letters (resolved_at) WHERE resolved_at IS NOT NULL;

-- Published outbox rows are deleted after an age: found by published_at in seq order.
CREATE INDEX outbox_published_idx ON outbox USING brin (published_at);
