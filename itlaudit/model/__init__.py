"""What things are: the scenario, raw records, workloads, finding codes and the redaction policy.

The lowest stage above `errors`: every other stage may import it; it imports nothing of itlaudit else.
"""
