"""Servers whose send times are known: the measuring stick for itlaudit's own capture fidelity."""
