"""`itlaudit selfcheck`: grade this machine's capture path against a server that knows its send times.

An auditor of ITL must first show that its own stamps are honest at the load it is asked to measure;
this command is that proof, run on the user's machine, with the same code path `itlaudit run` uses.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from itlaudit.analysis.fidelity import LAG_BUDGET_MS, Fidelity
from itlaudit.cli.options import ClusterOption, StampOption, WorkersOption, build_capture
from itlaudit.errors import ScenarioError
from itlaudit.model.vocabulary import DEFAULT_STAMP

out = Console(soft_wrap=True)

BUDGET = f"{LAG_BUDGET_MS:g} ms p99 added lag, min ≥ -{LAG_BUDGET_MS:g} ms, every chunk stamped"

_STYLES = {"PASS": "green", "WARN": "yellow", "FAIL": "bold red"}


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def describe(fidelity: Fidelity) -> str:
    error = fidelity.worst_itl_error
    stamped = (
        "every chunk stamped"
        if fidelity.every_chunk_stamped
        else f"{fidelity.missing_chunks} chunks and {fidelity.unmatched_responses} responses unstamped"
    )
    return (
        f"added lag min {_ms(fidelity.lag_min_ms)} / p50 {_ms(fidelity.lag_p50_ms)} / "
        f"p99 {_ms(fidelity.lag_p99_ms)} / max {_ms(fidelity.lag_max_ms)} ms over {fidelity.chunks} chunks; "
        "worst token-ITL error "
        f"{'–' if error is None else f'{error:.2%}'} ({fidelity.worst_response}); {stamped}"
    )


def selfcheck(
    streams: Annotated[int, typer.Option(help="Concurrent streams.", min=1)] = 8,
    chunks_per_s: Annotated[float, typer.Option(help="Chunks per second, per stream.", min=0.001)] = 500.0,
    tokens_per_chunk: Annotated[int, typer.Option(help="Tokens each chunk carries (K).", min=1)] = 1,
    tokens: Annotated[int, typer.Option(help="Tokens per request (max_tokens).", min=2)] = 500,
    workers: WorkersOption = "auto",
    stamp: StampOption = DEFAULT_STAMP,
    cluster: ClusterOption = "none",
    search: Annotated[
        bool, typer.Option("--search", help=f"Find the most streams kept within {BUDGET}.")
    ] = False,
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="Keep the run folders here (default: a temporary folder).")
    ] = None,
) -> None:
    """Run the real capture path against a built-in ground-truth SSE server; print its added lag."""
    from itlaudit.serve.truth import TruthConfig  # the truth server and the capture stack: only to run
    from itlaudit.workflows.selfcheck import run_trial, search_streams, truth_server, verdict

    capture = build_capture(workers=workers, stamp=stamp, cluster=cluster)
    config = TruthConfig(chunks_per_s=chunks_per_s, tokens_per_chunk=tokens_per_chunk)
    with tempfile.TemporaryDirectory(prefix="itlaudit-selfcheck-") as scratch:
        root = out_dir or Path(scratch)
        root.mkdir(parents=True, exist_ok=True)
        with truth_server(config, root) as server:
            count = 0

            def trial(n: int) -> Fidelity:
                nonlocal count
                count += 1
                result, lag = run_trial(server.url, n, tokens, root / f"run-{count:02d}-{n}streams", capture)
                out.print(
                    f"{n} streams × {chunks_per_s:g} chunks/s × {tokens_per_chunk} "
                    f"token{'s' if tokens_per_chunk != 1 else ''}/chunk: "
                    f"{describe(result)}; server send lag p99 {_ms(lag.p99_ms)} / max {_ms(lag.max_ms)} ms",
                    highlight=False,
                )
                return result

            if search:
                best, _ = search_streams(trial)
                load = f"{best} streams × {chunks_per_s:g} chunks/s = {best * chunks_per_s:g} chunks/s"
                found = (
                    f"highest load kept within {BUDGET}: {load}" if best else f"even 1 stream breaks {BUDGET}"
                )
                out.print(found, highlight=False)
                return
            result = trial(streams)
            if result.responses == 0:
                raise ScenarioError(
                    "the capture path recorded no response from the truth server; see its log"
                )
            status, meaning = verdict(result)
            out.print(f"{status}: {meaning}", style=_STYLES[status], markup=False, highlight=False)
