"""Names vulture reports that are used, though not by a call it can see: each is a parameter a
signature requires (a context manager's __exit__, a signal handler, asyncio's BufferedProtocol) and
the body has no use for. Only true false positives go here; dead code is deleted (scripts/test runs
`vulture itlaudit scripts/vulture_whitelist.py --min-confidence 80`)."""

exc_type  # __exit__(self, exc_type, exc, tb)
tb  # __exit__
signum  # a signal handler's (signum, frame)
sizehint  # asyncio.BufferedProtocol.get_buffer(sizehint)
