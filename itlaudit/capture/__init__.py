"""Capture: the I/O side of a run (streams, stamps, raw records), kept apart from analysis."""
