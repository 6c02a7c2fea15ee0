"""The `itlaudit` command line: one module per command group, each a thin wrapper over workflows."""

from itlaudit.cli.app import main

__all__ = ["main"]
