"""escrowd: the command line and the local runtime that wire the indexer, the consumers and the relayer."""
