"""Run folders on disk: paths, the append-only JSONL writer and reader, the ledger, exports."""
