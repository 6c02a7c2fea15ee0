"""`python -m itlaudit` (the demo launches its simulators this way, with the same interpreter)."""

from itlaudit.cli import main

main()
