"""Plugin verifiers for the registry tests (this package is on the tests' allow-list)."""
