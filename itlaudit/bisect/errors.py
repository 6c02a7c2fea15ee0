"""Bisect's own failures; both are one-line ItlauditErrors so the CLI never shows a traceback."""

from __future__ import annotations

from itlaudit.errors import ItlauditError


class BisectError(ItlauditError):
    """Bad input (range, commit, option) or an end of the range that does not behave as claimed."""


class BuildUnavailable(ItlauditError):
    """A build that cannot be found, downloaded or installed: the probe is a skip, never a bad."""
