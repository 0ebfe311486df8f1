"""The shared runtime below the services: database and migrations, Kafka and CloudEvents
plumbing, the outbox publisher, the idempotent consumer runtime, logging, start-up errors,
configuration files, health probes and the local service launchers.

`indexer/` and `relayer/` build on it; the application (`escrowd/`: the CLI and the
composition of the whole pipeline) sits on top. Nothing here imports either of them.
"""
