"""The `itlaudit` command line: the table of commands and the entry point, which turns errors into one
line. Each command lives in its own module (cli/run.py, cli/report.py, ...), parses and prints, and
calls a workflow; this module imports none of them (cli/style.py's LazyRoot loads the one that runs),
so `itlaudit --help` costs typer and this table."""

from __future__ import annotations

import sys
import threading
from typing import Annotated, NoReturn

import typer
from rich.console import Console

from itlaudit import __version__
from itlaudit.cli.style import Entry, LazyRoot
from itlaudit.errors import ItlauditError, RunInterrupted
from itlaudit.model.redact import redact_terminal
from itlaudit.model.stop import handle_signals, interruption, requested
from itlaudit.store.rundir import TOO_DEEP

# The command list's panels, in the order a newcomer needs them.
MEASURE, READ, GATE, TOOLS = "Measure", "Read results", "Gate a release", "Tools"

# Every command: its name, where it lives, its panel and its line in `itlaudit --help` (its docstring is
# its own --help). Within a panel, --help lists them in this order.
COMMANDS = (
    Entry(
        "run",
        "itlaudit.cli.run:run",
        MEASURE,
        "Stream a workload to each server and audit it: token-true ITL and truncation findings.",
    ),
    Entry(
        "compare",
        "itlaudit.cli.run:compare",
        MEASURE,
        "`run` plus each server's /metrics around its variant: spec-decode acceptance, mismatches "
        "explained, compare.json. The first variant is the baseline (K0).",
    ),
    Entry(
        "sweep",
        "itlaudit.cli.sweep:sweep",
        MEASURE,
        "Run the workload at each load for each variant and draw where speculative decoding stops "
        "paying off per token.",
    ),
    Entry(
        "invariance",
        "itlaudit.cli.audit:invariance",
        MEASURE,
        "Do a prompt's top-k logprobs depend on what shares its engine step? Alone, repeated, batched.",
    ),
    Entry(
        "report",
        "itlaudit.cli.report:report",
        READ,
        "Re-derive a run's files and write report.md, report.html and PNGs (several runs: one comparison).",
    ),
    Entry(
        "diff",
        "itlaudit.cli.report:diff",
        READ,
        "Compare two runs metric by metric: values, ratio, p-value, verdict; Markdown for a PR comment.",
    ),
    Entry(
        "export",
        "itlaudit.cli.report:export",
        READ,
        "Write chunks.csv / chunks.parquet (one row per SSE chunk) beside requests.csv, for notebooks.",
    ),
    Entry(
        "quality",
        "itlaudit.cli.audit:quality",
        READ,
        "Output-quality figures per request and which ones look like gibberish under these thresholds.",
    ),
    Entry(
        "track",
        "itlaudit.cli.track:track_app",
        READ,
        "A history of builds: record run folders, find and classify change points.",
    ),
    Entry(
        "smoke",
        "itlaudit.cli.smoke:smoke",
        GATE,
        "Pre-release go/no-go: full-length K0/K3 decode, stop tokens, caps, ITL vs thresholds and baseline.",
    ),
    Entry(
        "bisect",
        "itlaudit.cli.bisect:bisect",
        GATE,
        "Find the vLLM build that introduced (or, with --find-fix, fixed) a serving regression.",
    ),
    Entry(
        "sim",
        "itlaudit.cli.sim:sim",
        TOOLS,
        "Serve the vLLM-compatible simulator (demo and fault-injection target; not a test of vLLM).",
    ),
    Entry(
        "selfcheck",
        "itlaudit.cli.selfcheck:selfcheck",
        TOOLS,
        "Run the real capture path against a built-in ground-truth SSE server; print its added lag.",
    ),
    Entry(
        "demo",
        "itlaudit.cli.run:demo",
        TOOLS,
        "K0 vs K3 vs a 128-token-capped K3, on the built-in simulator: the seed case in ~20 seconds.",
    ),
    Entry("version", "itlaudit.cli.app:version", TOOLS, "Print itlaudit's version (also --version)."),
    Entry(
        "testbed",
        "itlaudit.cli.testbed:testbed_app",
        TOOLS,
        "Install the vLLM CPU testbed and build its models.",
    ),
    Entry(
        "ledger",
        "itlaudit.cli.audit:ledger_app",
        TOOLS,
        "Experiment ledger: the matrix of fingerprinted runs, and refusal of repeats.",
    ),
)


class _Root(LazyRoot):
    entries = COMMANDS


app = typer.Typer(
    cls=_Root,
    add_completion=False,
    no_args_is_help=True,
    help="Audit vLLM serving benchmarks: token-true ITL under speculative decoding, truncation findings.",
)
err = Console(stderr=True)
out = Console()


def _print_version(value: bool) -> None:
    if value:
        out.print(__version__)
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", is_eager=True, callback=_print_version, help="Print the version and exit."),
    ] = False,
) -> None:
    """Audit vLLM serving benchmarks: token-true ITL under speculative decoding, truncation findings.

    Runs when a command is about to (never for --help): the signal handlers (model.stop: a signal
    is recorded, each step stops at its next boundary) replace the entry point's starting ones here."""
    if threading.current_thread() is threading.main_thread():  # signal.signal works only there
        handle_signals()


def version() -> None:
    """Print itlaudit's version (also `itlaudit --version`)."""
    out.print(__version__)


def _usage_line(exc: typer.TyperException) -> str:
    """A usage error as one line: typer's own rendering spans a usage block, a hint and the message."""
    message = " ".join(exc.format_message().split())
    # typer 0.29 words a refused choice "Value error, 'x' is not one of ...": the prefix says nothing.
    message = message.replace(": Value error, ", ": ")
    ctx = getattr(exc, "ctx", None)
    command = ctx.command_path if ctx is not None else "itlaudit"
    return f"itlaudit: error: {message} (see `{command} --help`)"


def _exit_interrupted() -> NoReturn:
    """A Ctrl-C (or SIGTERM) outside a run, e.g. while a large dataset is read: one line, 130 or 143."""
    signal_name, exit_code = interruption()
    err.print(f"itlaudit: interrupted by {signal_name}", markup=False)
    sys.exit(exit_code)


def _bench_line() -> None:
    """A pasted `vllm bench serve` line after `run` or `compare`: its options made itlaudit's
    (cli.bench_flags), each accepted-but-inert one said in one line on stderr."""
    if len(sys.argv) < 2 or sys.argv[1] not in ("run", "compare"):
        return
    from itlaudit.cli.bench_flags import bench_argv

    line = bench_argv(sys.argv[2:])
    sys.argv[2:] = line.argv
    for note in line.notes:
        err.print(note, markup=False, highlight=False, soft_wrap=True)


def main() -> None:
    """Entry point: any ItlauditError or usage error becomes one line on stderr and its exit code,
    never a traceback. Everything printed from here on, by any command, is masked (URL userinfo, every
    credential the process knows of: redact.RedactedStream), whatever server text it quotes."""
    redact_terminal()
    try:
        _bench_line()
        # Non-standalone mode returns a command's exit code (typer.Exit) instead of exiting.
        code = app(prog_name="itlaudit", standalone_mode=False)
        if code == 130 or requested():
            # typer answers a Ctrl-C inside a command (no run yet) with a silent 130; a signal that
            # came after the command's last boundary (model.stop) still ends in 130/143, never 0
            _exit_interrupted()
    except RunInterrupted as exc:
        err.print(f"itlaudit: {exc}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except ItlauditError as exc:
        err.print(f"itlaudit: error: {exc}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except RecursionError:  # a JSON file read where no reader names it (store.rundir.read_json does)
        err.print(f"itlaudit: error: a file this command read: {TOO_DEEP}", markup=False, highlight=False)
        sys.exit(2)
    except (KeyboardInterrupt, typer.Abort):  # outside a run (typer turns Ctrl-C into Abort)
        _exit_interrupted()
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.TyperException as exc:  # typer's (vendored click's) usage errors
        if type(exc).__name__ == "NoArgsIsHelpError":  # a bare `itlaudit` or group: show the help
            exc.show()  # type: ignore[attr-defined]
        else:
            err.print(_usage_line(exc), markup=False, highlight=False, soft_wrap=True)
        sys.exit(getattr(exc, "exit_code", 2))
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
