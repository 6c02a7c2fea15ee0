"""What things are: the scenario, raw records, finding codes, workloads and the redaction policy (imports errors only)."""
