"""Test support: fault-injecting proxies and a harness to run and observe the indexer."""
