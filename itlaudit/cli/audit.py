"""`itlaudit invariance`, `itlaudit quality` and `itlaudit ledger`: thin wrappers over the correctness
audits, listed in cli/app.py. The invariance audit runs in workflows/audit.py, figures come from
analysis/ and the ledger from store/; this module parses arguments and prints."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from itlaudit.analysis.invariance import DEFAULT_SWEEP_SIZES
from itlaudit.analysis.quality import DEFAULT_THRESHOLDS, GibberishThresholds, gibberish_reasons, text_quality
from itlaudit.capture.scoring import DEFAULT_REPEATS, DEFAULT_TOP_K
from itlaudit.errors import ScenarioError
from itlaudit.store import ledger as ledger_mod
from itlaudit.store.jsonl import load_records
from itlaudit.store.rundir import REQUESTS_FILE, new_run_dir

if TYPE_CHECKING:
    from itlaudit.workflows.audit import VariantInvariance

MATRIX_WIDTH = 200
out = Console(soft_wrap=True)


def _int_list(text: str, option: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ScenarioError(f"{option} {text!r}: expected comma-separated integers, e.g. 1,2,4") from None
    if any(v < 0 for v in values):
        raise ScenarioError(f"{option} {text!r}: values must not be negative")
    return values


def _print_invariance(result: VariantInvariance, top_k: int) -> None:
    name, url, identity, summary = result.name, result.url, result.identity, result.summary
    batches = summary["batch2_batches"]
    build = f"vllm {identity.get('version')} ({identity.get('system_fingerprint')})"
    per_prompt = batches // summary["prompts"]
    out.print(f"[bold]{name}[/bold] @ {url}: {build}, {summary['prompts']} prompt(s) × {per_prompt}")
    out.print(f"  max |Δlogprob| over candidate ids in both top-{top_k} lists:")
    for key in ("alone_repeat", "alone_vs_batch2", "batch2_repeat"):
        out.print(f"    {key:<16} {summary[key]:.4f}")
    out.print(
        f"  top-{top_k} set differences: alone repeat {summary['top_set_diff_alone_repeat']}, "
        f"alone vs batch2 {summary['top_set_diff_alone_vs_batch2']}"
    )
    out.print(
        f"  batches bitwise identical to alone: {summary['batch2_identical_to_alone']}/{batches}; "
        f"rows of one batch identical to each other: {summary['batch2_rows_identical']}/{batches}"
    )
    out.print(f"  decision flip rate (alone vs batched): {summary['decision_flip_rate']:.1%}")
    concurrent = summary["concurrent"]
    if concurrent:
        out.print(
            "  two concurrent requests (step sharing left to timing): "
            f"vs alone {concurrent['vs_alone']:.4f}, repeat {concurrent['repeat']:.4f}, identical to alone "
            f"{concurrent['identical_to_alone']}/{concurrent['batches']}"
        )
    sweep = summary["sweep"]
    if sweep:
        deltas = ", ".join(f"{size}: {delta:.4f}" for size, delta in sweep["max_delta"].items())
        verdict = "batch-invariant" if sweep["invariant"] else "NOT batch-invariant"
        out.print(f"  batch-size sweep, max |Δ| vs 1 copy: {deltas} → {verdict}")


def invariance(
    scenario: Annotated[
        Path | None, typer.Argument(help="Scenario whose variants (servers) to score.")
    ] = None,
    url: Annotated[str | None, typer.Option(help="Score this server instead of a scenario's.")] = None,
    model: Annotated[
        str | None, typer.Option(help="Served model (default the scenario's, else the first served).")
    ] = None,
    prompt: Annotated[
        list[str] | None, typer.Option(help="Prompt to score (repeatable; default the scenario's prompts).")
    ] = None,
    repeats: Annotated[
        int, typer.Option("--repeats", "-n", min=1, help="Scorings per mode.")
    ] = DEFAULT_REPEATS,
    top_k: Annotated[
        int, typer.Option(min=1, max=20, help="logprobs candidates per scoring.")
    ] = DEFAULT_TOP_K,
    choices: Annotated[
        str | None, typer.Option(help="Comma-separated token ids: a decision is the argmax among them.")
    ] = None,
    concurrent: Annotated[
        bool,
        typer.Option(
            "--concurrent", help="Also score two concurrent requests (step sharing left to timing)."
        ),
    ] = False,
    sweep: Annotated[
        str, typer.Option(help="Copies per list for the batch-size sweep ('' = no sweep).")
    ] = ",".join(map(str, DEFAULT_SWEEP_SIZES)),
    out_dir: Annotated[Path | None, typer.Option("--out", help="Folder for invariance.json.")] = None,
) -> None:
    """Score prompts alone, alone repeated, as a batch of 2 in one engine step and that batch repeated:
    does a prompt's top-k logprobs depend on what shares its step?"""
    from itlaudit.store.rundir import DEFAULT_REPORTS
    from itlaudit.workflows.audit import (
        DEFAULT_PROMPTS,
        INVARIANCE_FILE,
        InvarianceSettings,
        invariance_audit,
        invariance_targets,
    )

    choice_ids = _int_list(choices, "--choices") if choices else None
    sizes = sorted(set(_int_list(sweep, "--sweep")) | ({1} if sweep else set()))
    if 0 in sizes:
        raise ScenarioError("--sweep sizes must be at least 1")
    variants, scenario_prompts, scenario_model = invariance_targets(scenario, url)
    settings = InvarianceSettings(
        prompts=list(dict.fromkeys(prompt or scenario_prompts or DEFAULT_PROMPTS)),
        model=model or scenario_model or "auto",
        repeats=repeats,
        top_k=top_k,
        choices=choice_ids,
        concurrent=concurrent,
        sweep_sizes=sizes,
    )
    run_dir = out_dir or new_run_dir(DEFAULT_REPORTS, "invariance")
    for result in invariance_audit(variants, settings, run_dir):
        _print_invariance(result, top_k)
    out.print(f"figures and raw scorings: {run_dir / INVARIANCE_FILE}")


def quality(
    run_dir: Annotated[Path, typer.Argument(help="A run folder holding requests.jsonl.")],
    max_digit_ratio: Annotated[float, typer.Option(help="Digits per non-space character.")] = (
        DEFAULT_THRESHOLDS.max_digit_ratio
    ),
    max_weird_runs: Annotated[int, typer.Option(help="Long digit/punctuation runs.")] = (
        DEFAULT_THRESHOLDS.max_weird_runs
    ),
    max_repeated_num_runs: Annotated[int, typer.Option(help="Numbers repeated 3+ times in a row.")] = (
        DEFAULT_THRESHOLDS.max_repeated_num_runs
    ),
    min_chars: Annotated[
        int, typer.Option(help="Shorter outputs are not judged.")
    ] = DEFAULT_THRESHOLDS.min_chars,
) -> None:
    """Output-quality figures per request and which ones look like gibberish under these thresholds."""
    thresholds = GibberishThresholds(max_digit_ratio, max_weird_runs, max_repeated_num_runs, min_chars)
    records = load_records(run_dir / REQUESTS_FILE)
    table = Table(
        "request", "chars", "digit_ratio", "weird", "rep num", "max digits", "rep-4", "zlib", "verdict"
    )
    suspected = 0
    for record in records:
        q = text_quality(record.output)
        reasons = gibberish_reasons(q, thresholds)
        suspected += bool(reasons)
        verdict = "; ".join(reasons) if reasons else ("too short" if q.chars < min_chars else "clean")
        table.add_row(
            record.request_id,
            str(q.chars),
            f"{q.digit_ratio:.4f}",
            str(q.weird_runs),
            str(q.repeated_num_runs),
            str(q.max_digit_run),
            f"{q.rep_4:.3f}",
            f"{q.compression_ratio:.2f}",
            verdict,
        )
    out.print(table)
    out.print(f"{suspected} of {len(records)} output(s) suspected gibberish")
    if any(r.params.ignore_eos for r in records):
        out.print(
            "note: some requests used ignore_eos; judge quality with natural EOS, since text forced past "
            "the model's own stop degrades on a healthy server too"
        )


ledger_app = typer.Typer(
    help="Experiment ledger: the matrix of fingerprinted runs, and refusal of repeats.",
    invoke_without_command=True,
    no_args_is_help=False,
)
LedgerOpt = Annotated[Path, typer.Option("--ledger", help="Ledger JSONL file.")]


@ledger_app.callback()
def ledger(ctx: typer.Context, ledger_path: LedgerOpt = ledger_mod.DEFAULT_LEDGER) -> None:
    """Print the experiment matrix (variant → result → hash → conclusion)."""
    ctx.obj = ledger_path
    if ctx.invoked_subcommand is not None:
        return
    rows = ledger_mod.matrix(ledger_mod.load_ledger(ledger_path))
    if not rows:
        out.print(f"{ledger_path}: no runs recorded yet (add one with `itlaudit ledger add RUN_DIR`)")
        return
    table = Table(
        "run", "variant", "build", "result", "hash", "fingerprint", "conclusion", title=str(ledger_path)
    )
    for row in rows:
        table.add_row(*row.values())
    # Seven columns squeezed into 80 wrap every cell; a wide matrix that scrolls reads better.
    Console(width=max(out.width, MATRIX_WIDTH)).print(table)


@ledger_app.command("add")
def ledger_add(
    ctx: typer.Context,
    run_dir: Annotated[Path, typer.Argument(help="A finished run folder (meta.json, requests.jsonl).")],
    repeat: Annotated[
        bool,
        typer.Option(
            "--repeat/--no-repeat", help="--no-repeat: refuse it (nothing recorded) if it was run before."
        ),
    ] = True,
) -> None:
    """Fingerprint a run's variants and add them; a repeat of an earlier fingerprint is named."""
    for line in ledger_mod.record_run(run_dir, ctx.obj, no_repeat=not repeat, environ=os.environ):
        was = f" (same experiment as run {line['repeat_of']!r})" if line["repeat_of"] else ""
        out.print(f"recorded {line['run_id']} / {line['variant']}: fingerprint {line['fingerprint']}{was}")


@ledger_app.command("conclude")
def ledger_conclude(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="The run's id (its folder name).")],
    variant: Annotated[str, typer.Argument(help="The variant the conclusion is about.")],
    text: Annotated[str, typer.Argument(help="What the run showed, in a sentence.")],
) -> None:
    """Fill the conclusion column for one row (a later conclusion replaces an earlier one)."""
    rows = ledger_mod.matrix(ledger_mod.load_ledger(ctx.obj))
    if not any(r["run"] == run_id and r["variant"] == variant for r in rows):
        raise ScenarioError(
            f"{ctx.obj} has no run {run_id!r} with variant {variant!r}; see `itlaudit ledger`"
        )
    ledger_mod.append(ctx.obj, [ledger_mod.conclusion_line(run_id, variant, text)])
    out.print(f"{run_id} / {variant}: {text}")
