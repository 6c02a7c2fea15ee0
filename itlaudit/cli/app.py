"""The `itlaudit` command line: thin wrappers that parse arguments and turn errors into one line."""

from __future__ import annotations

import functools
import inspect
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from itlaudit import __version__
from itlaudit.capture.runner import CaptureOptions
from itlaudit.cli import audit as cli_audit
from itlaudit.cli import bisect as cli_bisect
from itlaudit.cli import report as cli_report
from itlaudit.cli import selfcheck as cli_selfcheck
from itlaudit.cli import sim as cli_sim
from itlaudit.cli import smoke as cli_smoke
from itlaudit.cli import sweep as cli_sweep
from itlaudit.cli import testbed as cli_testbed
from itlaudit.errors import ItlauditError, RunInterrupted, ScenarioError
from itlaudit.model.access import Access, api_key_header, valid_header
from itlaudit.model.redact import header_secret_values, redact_text
from itlaudit.model.scenario import load_scenario, parse_scenario
from itlaudit.store.rundir import COMPARE_FILE, REPORT_FILE
from itlaudit.workflows.run import LedgerPolicy, RunOutcome, handle_sigterm, interruption, run_scenario

__all__ = [
    "DEMO_SCENARIO",
    "LEDGER",
    "ApiKeyOption",
    "AppendOption",
    "CaCertOption",
    "ClusterOption",
    "ConnectTimeoutOption",
    "ForceOption",
    "HeaderOption",
    "InsecureOption",
    "LedgerOption",
    "NoRepeatOption",
    "OutOption",
    "RequestTimeoutOption",
    "SharedRun",
    "StallTimeoutOption",
    "StampOption",
    "TtftTimeoutOption",
    "UrlOption",
    "VariantOption",
    "WorkersOption",
    "app",
    "compare",
    "demo",
    "err",
    "main",
    "out",
    "run",
    "version",
    "with_shared_run_options",
]

DEMO_SCENARIO = Path(__file__).resolve().parent.parent / "data" / "demo.toml"
LEDGER = Path("reports") / "ledger.jsonl"

# Options `run` and `compare` share.
UrlOption = Annotated[str | None, typer.Option(help="Send every variant to this server.")]
VariantOption = Annotated[list[str] | None, typer.Option(help="NAME=URL: this variant's server.")]
OutOption = Annotated[Path | None, typer.Option("--out", help="Run folder (default reports/<name>-<time>/).")]
LedgerOption = Annotated[Path, typer.Option(help="Experiment ledger: a repeat of a recorded run is named.")]
NoRepeatOption = Annotated[bool, typer.Option(help="Refuse a run the ledger already has.")]
ForceOption = Annotated[bool, typer.Option(help="Run even when --no-repeat would refuse it.")]
AppendOption = Annotated[bool, typer.Option(help="Add to the existing run folder given as --out.")]
WorkersOption = Annotated[
    str, typer.Option(help="Capture processes: N, or auto (enough for the concurrency, at most the cores).")
]
ConnectTimeoutOption = Annotated[float | None, typer.Option(help="Override [workload] connect_timeout_s.")]
TtftTimeoutOption = Annotated[float | None, typer.Option(help="Override [workload] ttft_timeout_s.")]
StallTimeoutOption = Annotated[float | None, typer.Option(help="Override [workload] stall_timeout_s.")]
RequestTimeoutOption = Annotated[float | None, typer.Option(help="Override [workload] request_timeout_s.")]
ApiKeyOption = Annotated[
    str | None,
    typer.Option(help="Sent as Authorization: Bearer (default: $OPENAI_API_KEY, else $VLLM_API_KEY)."),
]
HeaderOption = Annotated[
    list[str] | None, typer.Option("--header", help="'Name: value' sent with every request (repeatable).")
]
InsecureOption = Annotated[bool, typer.Option(help="https without checking the server's certificate.")]
CaCertOption = Annotated[Path | None, typer.Option(help="PEM bundle to verify the server's certificate.")]
StampOption = Annotated[
    str, typer.Option(help="kernel: socket receive time from the kernel (loop where unsupported); loop.")
]
ClusterOption = Annotated[
    str,
    typer.Option(
        help="none: capture processes here; ray (or auto): Ray actors on the running cluster, "
        "--workers in all; ray://HOST:PORT: that cluster."
    ),
]

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Audit vLLM serving benchmarks: token-true ITL under speculative decoding, truncation findings.",
)
err = Console(stderr=True)
# Header values this process sends (the API key among them): an error line quoting a server's answer is
# masked with them, since a 401's message may echo the key it got.
_SENT_SECRETS: set[str] = set()
out = Console()


def _parse_variant_urls(pairs: list[str]) -> dict[str, str]:
    urls: dict[str, str] = {}
    for pair in pairs:
        name, sep, url = pair.partition("=")
        if not sep or not name or not url.startswith(("http://", "https://")):
            raise ScenarioError(f"--variant {pair!r}: expected NAME=http://HOST:PORT")
        urls[name] = url.rstrip("/")
    return urls


@dataclass(frozen=True)
class SharedRun:
    """What `run` and `compare` take the same way: run_scenario's keyword arguments and the capture."""

    options: dict[str, Any]
    capture: CaptureOptions


def _shared_run_options(
    url: UrlOption = None,
    variant: VariantOption = None,
    out_dir: OutOption = None,
    ledger: LedgerOption = LEDGER,
    no_repeat: NoRepeatOption = False,
    force: ForceOption = False,
    append: AppendOption = False,
    workers: WorkersOption = "auto",
    stamp: StampOption = "kernel",
    cluster: ClusterOption = "none",
    connect_timeout: ConnectTimeoutOption = None,
    ttft_timeout: TtftTimeoutOption = None,
    stall_timeout: StallTimeoutOption = None,
    request_timeout: RequestTimeoutOption = None,
    api_key: ApiKeyOption = None,
    header: HeaderOption = None,
    insecure: InsecureOption = False,
    ca_cert: CaCertOption = None,
) -> SharedRun:
    """The options `run` and `compare` share, declared once (`with_shared_run_options` adds them to
    both commands) and checked once."""
    if append and out_dir is None:
        raise ScenarioError("--append needs --out: the run folder to add to")
    access = _access(api_key, header, insecure, ca_cert)
    capture = CaptureOptions.from_flags(
        workers,
        stamp,
        connect_timeout,
        ttft_timeout,
        stall_timeout,
        request_timeout,
        access=access,
        cluster=cluster,
    )
    options = {
        "url": url.rstrip("/") if url else None,
        "variant_urls": _parse_variant_urls(variant or []),
        "run_dir": out_dir,
        "console": err,
        "ledger": LedgerPolicy(ledger, no_repeat=no_repeat and not force),
        "append": append,
    }
    return SharedRun(options, capture)


_SHARED_PARAMS = list(inspect.signature(_shared_run_options, eval_str=True).parameters.values())


def with_shared_run_options(command: Callable[..., None]) -> Callable[..., None]:
    """Give a command taking `shared: SharedRun` the shared options as its own, after its own ones:
    typer reads the combined signature, the command gets them checked and bundled."""
    own = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.name != "shared"]
    names = [p.name for p in _SHARED_PARAMS]

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> None:
        shared = _shared_run_options(**{name: kwargs.pop(name) for name in names})
        command(**kwargs, shared=shared)

    params = [*own, *_SHARED_PARAMS]
    wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper


def _access(api_key: str | None, headers: list[str] | None, insecure: bool, ca_cert: Path | None) -> Access:
    """What every request carries: the API key as Authorization, then each --header as given."""
    pairs: list[tuple[str, str]] = []
    bearer = api_key_header(api_key, os.environ)
    if bearer is not None:
        pairs.append(bearer)
    for text in headers or []:
        name, sep, value = text.partition(":")
        name, value = name.strip(), value.strip()
        if not sep or not valid_header(name, value):
            shown = name or text.partition(":")[0]
            raise ScenarioError(
                f"--header {shown!r}...: expected 'Name: value' (a header name, a colon, a value)"
            )
        pairs.append((name, value))
    _SENT_SECRETS.update(header_secret_values(pairs))  # a server's error may echo one: mask it there
    if ca_cert is not None and not ca_cert.is_file():
        raise ScenarioError(f"--ca-cert {ca_cert}: no such file; give a PEM bundle of CA certificates")
    return Access(headers=(), insecure=insecure, ca_cert=str(ca_cert) if ca_cert else None).with_headers(
        dict(pairs)
    )


def _print_outcome(outcome: RunOutcome) -> None:
    for name, block in outcome.summary["variants"].items():
        itl = block["itl_ms"]["p50"]
        chunk = block["chunk_itl_ms"]["p50"]
        tokens = block["completion_tokens"]["p50"]
        found = ", ".join(f"{c}×{n}" for c, n in block["findings"].items()) or "none"
        figures = (
            f"token ITL p50 {itl:.2f} ms, chunk ITL p50 {chunk:.2f} ms"
            if itl is not None and chunk is not None
            else "no ITL (no decode chunks)"
        )
        out.print(f"[bold]{name}[/bold]: {figures}, completion tokens p50 {tokens}, findings: {found}")
    out.print(f"report: {outcome.run_dir / REPORT_FILE}")


@app.command()
@with_shared_run_options
def run(
    scenario: Annotated[Path, typer.Argument(help="Scenario TOML file (see scenarios/).")],
    fail_on_findings: Annotated[bool, typer.Option(help="Exit 1 when any finding fires.")] = False,
    *,
    shared: SharedRun,
) -> None:
    """Stream the scenario's requests and audit them: ITL from server token counts, truncation findings."""
    outcome = run_scenario(load_scenario(scenario), **shared.options, capture=shared.capture)
    _print_outcome(outcome)
    if fail_on_findings and outcome.finding_count:
        raise typer.Exit(1)


@app.command()
@with_shared_run_options
def compare(
    scenario: Annotated[Path, typer.Argument(help="Scenario TOML with a K0 (first) and K3 variant.")],
    *,
    shared: SharedRun,
) -> None:
    """Run each variant (launching its server in turn), scrape /metrics around it, write compare.json."""
    from itlaudit.workflows.compare import run_compare

    outcome, comparison = run_compare(load_scenario(scenario), **shared.options, capture=shared.capture)
    _print_outcome(outcome)
    for name, row in comparison["variants"].items():
        spec = row["spec_decode"] or {}
        out.print(
            f"{name}: token-ITL speedup {_fmt(row['speedup_token_itl'], '×')}, decode tok/s speedup "
            f"{_fmt(row['speedup_decode_tokens_per_s'], '×')}, "
            f"acceptance rate {_fmt(spec.get('acceptance_rate'))}, "
            f"acceptance length /metrics {_fmt(spec.get('acceptance_length'))} vs stream "
            f"{_fmt(row['stream_acceptance_length'])}"
        )
    for finding in comparison["findings"]:
        out.print(f"[bold red]{finding['code']}[/bold red]: {finding['message']}", highlight=False)
    out.print(f"compare: {outcome.run_dir / COMPARE_FILE}")


def _fmt(value: float | None, unit: str = "") -> str:
    return "–" if value is None else f"{value:.2f}{unit}"


@app.command()
def demo(
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="Run folder (default reports/demo-...).")
    ] = None,
    workers: WorkersOption = "auto",
    stamp: StampOption = "kernel",
    api_key: ApiKeyOption = None,
    header: HeaderOption = None,
) -> None:
    """K0 vs K3 vs a 128-token-capped K3, on the built-in simulator: the seed case in 30 seconds."""
    capture = CaptureOptions.from_flags(workers, stamp, access=_access(api_key, header, False, None))
    scenario = parse_scenario(DEMO_SCENARIO.read_text(encoding="utf-8"), DEMO_SCENARIO)
    outcome = run_scenario(scenario, run_dir=out_dir, console=err, capture=capture)
    _print_outcome(outcome)


app.command(name="sim")(cli_sim.sim)  # here, not below: `--help` lists commands in this order


@app.command()
def version() -> None:
    """Print itlaudit's version."""
    out.print(__version__)


# Commands that live in their own modules register here, one line each (keep this file thin).
app.add_typer(cli_testbed.testbed_app, name="testbed")
app.command(name="report")(cli_report.report)
app.command(name="diff")(cli_report.diff)
app.command(name="export")(cli_report.export)
app.command(name="bisect")(cli_bisect.bisect)
app.command(name="smoke")(cli_smoke.smoke)
app.command(name="selfcheck")(cli_selfcheck.selfcheck)
app.command(name="invariance")(cli_audit.invariance)
app.command(name="quality")(cli_audit.quality)
app.add_typer(cli_audit.ledger_app, name="ledger")
app.command(name="sweep")(cli_sweep.sweep)


def _usage_line(exc: typer.TyperException) -> str:
    """A usage error as one line: typer's own rendering spans a usage block, a hint and the message."""
    message = " ".join(exc.format_message().split())  # type: ignore[attr-defined]
    ctx = getattr(exc, "ctx", None)
    command = ctx.command_path if ctx is not None else "itlaudit"
    return f"itlaudit: error: {message} (see `{command} --help`)"


def main() -> None:
    """Entry point: any ItlauditError or usage error becomes one line on stderr and its exit code,
    never a traceback."""
    handle_sigterm()
    try:
        # Non-standalone mode returns a command's exit code (typer.Exit) instead of exiting.
        code = app(standalone_mode=False)
    except RunInterrupted as exc:
        err.print(f"itlaudit: {exc}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except ItlauditError as exc:
        message = redact_text(str(exc), _SENT_SECRETS)
        err.print(f"itlaudit: error: {message}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except (KeyboardInterrupt, typer.Abort):  # outside a run (typer turns Ctrl-C into Abort)
        signal_name, exit_code = interruption()
        err.print(f"itlaudit: interrupted by {signal_name}", markup=False)
        sys.exit(exit_code)
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
