"""Pure figures and rules: metrics, derived records, findings, comparisons, statistics."""
