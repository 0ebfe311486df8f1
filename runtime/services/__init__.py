"""Launchers for the local services the pipeline and the tests run against.

Each launcher starts a real server (anvil, PostgreSQL, a Kafka-compatible broker) on
127.0.0.1 or a private socket, waits until it answers, and stops what it started.
"""
