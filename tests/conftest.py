"""Shared fixtures: real PostgreSQL, Kafka and anvil, started on demand and always stopped."""

pytest_plugins = ["tests.fixtures.services", "tests.fixtures.chain"]
