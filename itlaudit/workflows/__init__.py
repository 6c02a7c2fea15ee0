"""What the commands compose: run, compare, sweep, selfcheck."""
