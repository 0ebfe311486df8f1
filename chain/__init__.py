"""The chain toolkit every service shares: JSON-RPC, ABI encoding, fees, nonces, keys, transactions."""
