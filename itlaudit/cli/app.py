"""The `itlaudit` command line: thin wrappers that parse arguments and turn errors into one line."""

from __future__ import annotations

import os
import sys
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

DEMO_SCENARIO = Path(__file__).parent / "data" / "demo.toml"
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


def _run_options(
    url: str | None,
    variant: list[str] | None,
    out_dir: Path | None,
    ledger: Path,
    no_repeat: bool,
    force: bool,
    append: bool,
) -> dict[str, Any]:
    """The keyword arguments `run` and `compare` pass the same way."""
    if append and out_dir is None:
        raise ScenarioError("--append needs --out: the run folder to add to")
    return {
        "url": url.rstrip("/") if url else None,
        "variant_urls": _parse_variant_urls(variant or []),
        "run_dir": out_dir,
        "console": err,
        "ledger": LedgerPolicy(ledger, no_repeat=no_repeat and not force),
        "append": append,
    }


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
def run(
    scenario: Annotated[Path, typer.Argument(help="Scenario TOML file (see scenarios/).")],
    url: UrlOption = None,
    variant: VariantOption = None,
    out_dir: OutOption = None,
    fail_on_findings: Annotated[bool, typer.Option(help="Exit 1 when any finding fires.")] = False,
    ledger: LedgerOption = LEDGER,
    no_repeat: NoRepeatOption = False,
    force: ForceOption = False,
    append: AppendOption = False,
    workers: WorkersOption = "auto",
    stamp: StampOption = "kernel",
    connect_timeout: ConnectTimeoutOption = None,
    ttft_timeout: TtftTimeoutOption = None,
    stall_timeout: StallTimeoutOption = None,
    request_timeout: RequestTimeoutOption = None,
    api_key: ApiKeyOption = None,
    header: HeaderOption = None,
    insecure: InsecureOption = False,
    ca_cert: CaCertOption = None,
) -> None:
    """Stream the scenario's requests and audit them: ITL from server token counts, truncation findings."""
    access = _access(api_key, header, insecure, ca_cert)
    capture = CaptureOptions.from_flags(
        workers, stamp, connect_timeout, ttft_timeout, stall_timeout, request_timeout, access=access
    )
    loaded = load_scenario(scenario)
    options = _run_options(url, variant, out_dir, ledger, no_repeat, force, append)
    outcome = run_scenario(loaded, **options, capture=capture)
    _print_outcome(outcome)
    if fail_on_findings and outcome.finding_count:
        raise typer.Exit(1)


@app.command()
def compare(
    scenario: Annotated[Path, typer.Argument(help="Scenario TOML with a K0 (first) and K3 variant.")],
    url: UrlOption = None,
    variant: VariantOption = None,
    out_dir: OutOption = None,
    ledger: LedgerOption = LEDGER,
    no_repeat: NoRepeatOption = False,
    force: ForceOption = False,
    append: AppendOption = False,
    workers: WorkersOption = "auto",
    stamp: StampOption = "kernel",
    connect_timeout: ConnectTimeoutOption = None,
    ttft_timeout: TtftTimeoutOption = None,
    stall_timeout: StallTimeoutOption = None,
    request_timeout: RequestTimeoutOption = None,
    api_key: ApiKeyOption = None,
    header: HeaderOption = None,
    insecure: InsecureOption = False,
    ca_cert: CaCertOption = None,
) -> None:
    """Run each variant (launching its server in turn), scrape /metrics around it, write compare.json."""
    from itlaudit.workflows.compare import run_compare

    access = _access(api_key, header, insecure, ca_cert)
    capture = CaptureOptions.from_flags(
        workers, stamp, connect_timeout, ttft_timeout, stall_timeout, request_timeout, access=access
    )
    outcome, comparison = run_compare(
        load_scenario(scenario),
        **_run_options(url, variant, out_dir, ledger, no_repeat, force, append),
        capture=capture,
    )
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
