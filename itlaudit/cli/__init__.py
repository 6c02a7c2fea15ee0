"""The `itlaudit` command line: one module per command group, each a thin wrapper over workflows."""

__all__ = ["main"]


def main() -> None:
    """The console script's entry point (pyproject's `itlaudit.cli:main`). The CLI is imported when it
    runs, not with this package: a capture worker (forkserver) re-runs the script's module-level code,
    which imports this package, before its target, and must not load the whole CLI to do so."""
    from itlaudit.cli.app import main as run

    run()
