"""`itlaudit smoke`: the go/no-go command (exit 0 go, 1 a check failed, 2 could not run)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from itlaudit.capture.runner import CaptureOptions
from itlaudit.cli.options import (
    UrlOption,
    VariantOption,
    parse_url,
    parse_variant_urls,
    trial_capture_options,
    with_options,
)
from itlaudit.errors import ItlauditError
from itlaudit.smoke.junit import write_junit_error
from itlaudit.smoke.output import table_lines, verdict_line
from itlaudit.smoke.suite import load_suite

# The checkout's scenarios/ folder, found from the package rather than the working directory, so a bare
# `itlaudit smoke` works from anywhere.
DEFAULT_SUITE = Path(__file__).resolve().parents[2] / "scenarios" / "smoke" / "dgx-spark"
_STYLES = {"PASS": "green", "FAIL": "bold red", "SKIP": "yellow"}

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True)


def _servers(url: str | None, variant: list[str] | None) -> dict[str, str]:
    """--variant NAME=URL per server of the suite; --url URL for every server ("*")."""
    urls = parse_variant_urls(variant or [])
    if url:
        urls["*"] = parse_url(url, f"--url {url!r}")
    return urls


@with_options("capture", trial_capture_options)
def smoke(
    suite: Annotated[
        Path,
        typer.Option(
            metavar="DIR", help="Suite folder holding suite.toml.", show_default="scenarios/smoke/dgx-spark"
        ),
    ] = DEFAULT_SUITE,
    url: UrlOption = None,
    variant: VariantOption = None,
    launch: Annotated[
        str | None, typer.Option(help="Start servers with python:PATH, docker:IMAGE or command:CMD.")
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="Model for launched servers (overrides the suite).")
    ] = None,
    baseline: Annotated[
        Path | None, typer.Option(help="A previous smoke.json: adds the ratio-to-baseline checks.")
    ] = None,
    junit: Annotated[Path | None, typer.Option(help="Also write the JUnit XML here.")] = None,
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="Smoke folder (default reports/smoke-<suite>-<time>/).")
    ] = None,
    *,
    capture: CaptureOptions,
) -> None:
    """Pre-release go/no-go: full-length K0/K3 decode, stop tokens, caps, ITL vs thresholds and baseline."""
    from itlaudit.smoke.runner import REPORT_FILE, run_smoke  # the capture stack: only to run

    try:
        loaded = load_suite(suite)
        out.print(f"smoke suite {loaded.name}: {loaded.path.resolve()}", markup=False)
        outcome = run_smoke(
            loaded,
            urls=_servers(url, variant),
            launch=launch,
            model=model,
            baseline=baseline,
            out_dir=out_dir,
            junit=junit,
            console=err,
            capture=capture,
        )
    except ItlauditError as exc:
        if junit is not None:
            write_junit_error(junit, suite.name, str(exc))
        raise
    for line, result in zip(table_lines(outcome.results), outcome.results, strict=True):
        out.print(line, style=_STYLES[result.status], markup=False)
    out.print(verdict_line(outcome.results, outcome.smoke.runtime_s), style="bold", markup=False)
    out.print(f"report: {(outcome.out_dir / REPORT_FILE).resolve()}", markup=False)
    if outcome.exit_code:
        raise typer.Exit(outcome.exit_code)
