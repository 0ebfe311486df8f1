// An example subscriber of escrowd's topics in TypeScript (kafkajs): a task-state view and an
// agent-reputation view, kept in a JSON file.
//
//   node dist/subscriber.js --bootstrap localhost:9092 --store views.json [--group my-service]
//
// It follows docs/subscribing.md, like the Python example: at-least-once delivery deduplicated
// on `ce_id`, applied and written (atomically: a temporary file renamed over the store) before
// the Kafka offsets are committed; a retraction (`removed: true`) undoes the event it names and
// the task is refolded from the events that remain.
//
// - tasks (escrow.events.v1): a task's status is the `status` field of its newest live event in
//   chain order (block number, log index); every escrow task event carries the status after it.
// - reputation (escrow.reputation.v1, compacted): each record is the agent's whole reputation;
//   the one with the highest `ce_sequence` wins. (Offsets are not enough: a send the publisher
//   retried after a broker failure can land an older record after a newer one, and the newer
//   one's redelivery is then dropped as seen.)

import { readFileSync, renameSync, writeFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { Kafka, logLevel, type EachBatchPayload } from "kafkajs";

const EVENTS = "escrow.events.v1";
const REPUTATION = "escrow.reputation.v1";
const MAX_RECORD_BYTES = 1 << 20; // our own topics are hostile input too

interface TaskEvent {
  task: string; // `<chain id>:<escrow lower case>:<task id>`
  blockNumber: number;
  logIndex: number;
  status: number;
}

interface Reputation {
  score: number;
  dispute_count: number;
  passes: number;
  failures: number;
  matching_score: number;
  sequence: string; // ce_sequence: 20 digits, so string order is number order
}

interface Store {
  seen: Record<string, true>;
  events: Record<string, TaskEvent>; // live task events by ce_id
  tasks: Record<string, number>; // task → status
  reputation: Record<string, Reputation>; // agent (lower case) → reputation
}

function load(path: string): Store {
  try {
    return JSON.parse(readFileSync(path, "utf8")) as Store;
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== "ENOENT") throw error;
    return { seen: {}, events: {}, tasks: {}, reputation: {} };
  }
}

function save(path: string, store: Store): void {
  writeFileSync(`${path}.tmp`, JSON.stringify(store));
  renameSync(`${path}.tmp`, path); // a reader (or a crash) sees the old store or the new one
}

function refold(store: Store, task: string): void {
  let newest: TaskEvent | undefined;
  for (const event of Object.values(store.events)) {
    if (event.task !== task) continue;
    if (!newest || event.blockNumber > newest.blockNumber ||
        (event.blockNumber === newest.blockNumber && event.logIndex > newest.logIndex)) {
      newest = event;
    }
  }
  if (newest) store.tasks[task] = newest.status;
  else delete store.tasks[task];
}

function applyEvent(store: Store, ceId: string, body: any): void {
  if (body.task_id === null || body.task_id === undefined) return; // escrow-wide event
  // Task ids are uint256: never through a JS number. JSON.parse has already rounded any id
  // above 2^53, so the example reads small ids only; a production subscriber parses with a
  // big-integer-aware JSON reader (the key `<chain id>:<task id>` carries the exact digits too).
  const task = `${body.chain_id}:${String(body.escrow_address).toLowerCase()}:${BigInt(body.task_id)}`;
  if (body.removed === true) {
    delete store.events[ceId.replace(/:removed$/, "")]; // `<id it retracts>:removed`
  } else {
    const status = body.args?.status;
    if (!Number.isInteger(status) || status < 0 || status > 9) throw new Error(`bad status ${status}`);
    store.events[ceId] = { task, blockNumber: body.block_number, logIndex: body.log_index, status };
  }
  refold(store, task);
}

function applyReputation(store: Store, body: any, sequence: string): void {
  if (!/^[0-9]{20}$/.test(sequence)) throw new Error("ce_sequence is not 20 digits");
  const agent = String(body.agent).toLowerCase();
  const held = store.reputation[agent];
  if (held && held.sequence >= sequence) return; // an older record, landed after a newer one
  const { score, dispute_count, passes, failures, matching_score } = body;
  store.reputation[agent] = { score, dispute_count, passes, failures, matching_score, sequence };
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      bootstrap: { type: "string" },
      store: { type: "string" },
      group: { type: "string", default: "example-typescript-subscriber" },
      "events-topic": { type: "string", default: EVENTS },
      "reputation-topic": { type: "string", default: REPUTATION },
    },
  });
  if (!values.bootstrap || !values.store) throw new Error("--bootstrap and --store are required");
  const storePath = values.store;
  const store = load(storePath);
  const kafka = new Kafka({ clientId: "escrowd-example", brokers: values.bootstrap.split(","), logLevel: logLevel.WARN });
  const consumer = kafka.consumer({ groupId: values.group! });
  await consumer.connect();
  const eventsTopic = values["events-topic"]!;
  const reputationTopic = values["reputation-topic"]!;
  await consumer.subscribe({ topics: [eventsTopic, reputationTopic], fromBeginning: true });

  await consumer.run({
    autoCommit: false,
    eachBatchAutoResolve: false,
    eachBatch: async ({ batch, resolveOffset, heartbeat }: EachBatchPayload) => {
      for (const message of batch.messages) {
        const ceId = message.headers?.ce_id?.toString() ?? "";
        if (ceId && message.value && message.value.length <= MAX_RECORD_BYTES && !store.seen[ceId]) {
          store.seen[ceId] = true;
          // applyEvent checks everything before it changes the store: a throw leaves no partial effect.
          try {
            const body = JSON.parse(message.value.toString("utf8"));
            if (batch.topic === eventsTopic) applyEvent(store, ceId, body);
            else if (batch.topic === reputationTopic) {
              applyReputation(store, body, message.headers?.ce_sequence?.toString() ?? "");
            }
          } catch (error) {
            // Never stop a partition on one record (a production service dead-letters it).
            console.log(JSON.stringify({ event: "record_skipped", ceId, error: String(error) }));
          }
        }
        resolveOffset(message.offset);
      }
      save(storePath, store);
      // Offsets only after the store is written: a crash in between redelivers, `seen` drops it.
      const last = batch.messages[batch.messages.length - 1];
      if (last) {
        await consumer.commitOffsets([
          { topic: batch.topic, partition: batch.partition, offset: (BigInt(last.offset) + 1n).toString() },
        ]);
      }
      await heartbeat();
    },
  });
  console.log(JSON.stringify({ event: "subscriber_started", group: values.group }));

  const stop = async (): Promise<void> => {
    await consumer.disconnect();
    console.log(JSON.stringify({ event: "subscriber_stopped" }));
    process.exit(0);
  };
  process.once("SIGTERM", () => void stop());
  process.once("SIGINT", () => void stop());
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
