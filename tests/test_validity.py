"""The one rule for "may this variant be ranked?" (analysis.validity) on hand-built run summaries:
it fires for a truncated, failing, or mostly gibberish variant (against a clean baseline) with
the numbers in its reason, stays quiet for a clean one, for one gibberish request in ten and for
gibberish on both sides (then its phrase says so), and a comparison against a base that breaks it is
not comparable either. Pure functions: about 1 s for the file."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.figure import Figure
from reportkit import block as summary_block
from simkit import itlaudit

from itlaudit.analysis.summary import RunSummary
from itlaudit.analysis.validity import (
    COMPARABLE,
    Validity,
    block_counts,
    block_validity,
    comparison_validity,
    quality_note,
    variant_validity,
)
from itlaudit.model.vocabulary import QualityGate


def summary(
    findings: dict[str, int] | None = None,
    *,
    requests: int = 6,
    errors: int = 0,
    base: dict[str, int] | None = None,
    **extra: Any,
) -> RunSummary:
    return RunSummary(
        variants={
            "K0": summary_block(requests=6, errors=0, findings=base or {}),
            "K3": summary_block(requests=requests, errors=errors, findings=findings or {}),
        },
        run_findings=extra.pop("run_findings", []),
        quality_gate=QualityGate(extra.pop("quality_gate", QualityGate.RELATIVE)),
        **extra,
    )


def common_cap(variant: str, cap: int, hits: int) -> dict[str, Any]:
    return {"code": "common_cap", "evidence": {"variant": variant, "cap": cap, "requests_at_cap": hits}}


def test_a_clean_variant_is_comparable() -> None:
    result = variant_validity(summary({"stop_reason_unexpected": 1}), "K3")
    assert result == COMPARABLE and result.comparable and result.reason is None and result.label == ""


def test_a_capped_variant_names_the_cap_in_its_reason() -> None:
    counts = {"truncated_below_max_tokens": 6, "min_tokens_violated": 6, "common_cap": 1}
    result = variant_validity(summary(counts, run_findings=[common_cap("K3", 128, 6)]), "K3")
    assert result == Validity(False, "6 of 6 requests capped at 128 tokens")
    assert result.label == "not comparable: 6 of 6 requests capped at 128 tokens"


@pytest.mark.parametrize("code", ["truncated_below_max_tokens", "ignore_eos_violated", "min_tokens_violated"])
def test_one_truncated_request_is_enough(code: str) -> None:
    assert variant_validity(summary({code: 1}), "K3") == Validity(False, "1 of 6 requests cut short")


def test_truncations_beyond_the_common_cap_are_counted_too() -> None:
    found = summary({"truncated_below_max_tokens": 5}, run_findings=[common_cap("K3", 128, 3)])
    assert variant_validity(found, "K3").reason == "5 of 6 requests cut short, 3 of them capped at 128 tokens"


def test_a_failed_request_is_enough() -> None:
    assert variant_validity(summary(errors=1), "K3") == Validity(False, "1 of 6 requests failed")


def test_gibberish_counts_only_on_most_requests() -> None:
    assert variant_validity(summary({"gibberish_suspected": 1}, requests=10), "K3").comparable
    assert variant_validity(summary({"gibberish_suspected": 5}, requests=10), "K3").comparable  # half
    assert variant_validity(summary({"gibberish_suspected": 6}, requests=10), "K3") == Validity(
        False, "6 of 10 requests look like gibberish where the baseline's do not"
    )


def test_gibberish_gates_only_where_the_baseline_writes_clean_text() -> None:
    """Seed 003's case (K3 broken, K0 clean) is not comparable; dummy weights or a stand-in server
    (gibberish on both sides) are compared, and the phrase says quality was not judged."""
    broken = summary({"gibberish_suspected": 6})
    assert variant_validity(broken, "K3") == Validity(
        False, "6 of 6 requests look like gibberish where the baseline's do not"
    )
    assert quality_note(broken) is None  # its label says it
    both = summary({"gibberish_suspected": 6}, base={"gibberish_suspected": 6}, dummy_weights=["K0", "K3"])
    assert variant_validity(both, "K3") == COMPARABLE and variant_validity(both, "K0") == COMPARABLE
    assert quality_note(both) == (
        "outputs are gibberish in both variants (K0, K3: dummy weights, --load-format dummy): "
        "speed compared, quality not judged"
    )
    assert quality_note(summary({"gibberish_suspected": 1})) is None  # nothing to say


def test_a_baseline_or_a_single_variant_never_hides_behind_quality() -> None:
    only = RunSummary(
        variants={"K0": summary_block(requests=4, findings={"gibberish_suspected": 4})}, run_findings=[]
    )
    assert variant_validity(only, "K0") == COMPARABLE
    assert quality_note(only) == "outputs are gibberish: speed measured, quality not judged"
    base_broken = summary(base={"gibberish_suspected": 6})
    assert variant_validity(base_broken, "K0") == COMPARABLE
    assert quality_note(base_broken) == "outputs are gibberish in K0: speed compared, quality not judged"


def test_strict_and_off_gates() -> None:
    """`quality_gate = "strict"` is the earlier rule (gibberish gates every variant); "off" never gates
    on it, but a cap or a failure still makes the variant incomparable."""
    both = {"base": {"gibberish_suspected": 6}}
    strict = summary({"gibberish_suspected": 6}, quality_gate="strict", **both)
    assert variant_validity(strict, "K0").reason == "6 of 6 requests look like gibberish"
    assert variant_validity(strict, "K3").reason == "6 of 6 requests look like gibberish"
    assert quality_note(strict) is None
    off = summary({"gibberish_suspected": 6, "truncated_below_max_tokens": 1}, errors=1, quality_gate="off")
    assert variant_validity(off, "K3") == Validity(False, "1 of 6 requests cut short; 1 of 6 requests failed")
    assert variant_validity(summary({"gibberish_suspected": 6}, quality_gate="off"), "K3") == COMPARABLE
    block = block_counts(summary({"gibberish_suspected": 6}).variants["K3"])
    assert block_validity(block) == COMPARABLE  # alone: nothing to be relative to
    assert not block_validity(block, gate=QualityGate.STRICT).comparable


def test_every_reason_is_given_together() -> None:
    found = summary({"truncated_below_max_tokens": 2, "gibberish_suspected": 4}, errors=1)
    assert variant_validity(found, "K3").reason == (
        "2 of 6 requests cut short; 1 of 6 requests failed; "
        "4 of 6 requests look like gibberish where the baseline's do not"
    )


def test_a_variant_without_requests_is_not_comparable() -> None:
    assert variant_validity(summary(), "K9") == Validity(False, "no requests recorded")
    assert not block_validity({"requests": 0, "errors": 0, "findings": {}}).comparable


def test_the_cap_of_another_variant_is_not_borrowed() -> None:
    found = summary({"truncated_below_max_tokens": 6}, run_findings=[common_cap("K0", 64, 6)])
    assert variant_validity(found, "K3").reason == "6 of 6 requests cut short"


def test_a_comparison_is_only_as_comparable_as_both_sides() -> None:
    capped = Validity(False, "6 of 6 requests capped at 128 tokens")
    assert comparison_validity(COMPARABLE, COMPARABLE, "K0") == COMPARABLE
    assert comparison_validity(capped, COMPARABLE, "K0") == capped
    assert comparison_validity(COMPARABLE, capped, "K0").label == (
        "not comparable: base K0: 6 of 6 requests capped at 128 tokens"
    )
    both = comparison_validity(Validity(False, "1 of 6 requests failed"), capped, "K0")
    assert both.reason == "1 of 6 requests failed; base K0: 6 of 6 requests capped at 128 tokens"


def _point(load: int, itl: float, not_comparable: str | None = None) -> dict[str, Any]:
    figures = {p: itl for p in ("p50", "p90", "p99")}
    return {"concurrency": load, "itl_ms": figures, "not_comparable": not_comparable}


def test_a_sweep_never_ranks_a_point_that_breaks_the_rule() -> None:
    """K3 capped at concurrency 4 looks 2.5× faster there; the crossover leaves that load out and
    says why, and the speedup figure draws no ratio for it."""
    from itlaudit.analysis.sweep import crossover, trial_figures
    from itlaudit.model.vocabulary import LoadAxis

    capped = "6 of 6 requests cut short"
    series = {
        "K0": [_point(c, 10.0) for c in (1, 4, 16)],
        "K3": [_point(1, 5.0), _point(4, 4.0, capped), _point(16, 12.0)],
    }
    found = crossover(LoadAxis.CONCURRENCY, "K0", "K3", series)
    assert (found.last_faster, found.first_slower) == (1, 16)
    assert found.headline == (
        "K3 is faster per token up to concurrency 1 (2.00×); at 16, K0 is 1.20× faster. "
        "Not comparable at concurrency 4 (K3: 6 of 6 requests cut short): left out."
    )
    base_capped = {"K0": [_point(4, 10.0, "1 of 6 requests failed")], "K3": [_point(4, 5.0)]}
    words = crossover(LoadAxis.CONCURRENCY, "K0", "K3", base_capped).headline
    assert "faster" not in words and "no load measured by both is comparable" in words
    block = summary_block(requests=6, findings={"truncated_below_max_tokens": 6})
    assert trial_figures(block, [], [], {})["not_comparable"] == capped


def test_the_sweep_speedup_figure_draws_a_grey_cross_not_a_ratio_where_a_point_is_not_comparable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    series = {
        "K0": [_point(c, 10.0) for c in (1, 4, 16)],
        "K3": [_point(1, 5.0), _point(4, 4.0, "6 of 6 requests cut short"), _point(16, 12.0)],
    }
    lines = _speedup_lines(series, tmp_path, monkeypatch)
    speedups = np.asarray(lines["K3 over K0"].get_ydata(), dtype=float)
    assert speedups[[0, 2]] == pytest.approx([2.0, 10 / 12]) and np.isnan(speedups[1])
    cross = lines["K3: not comparable"]
    assert list(cross.get_xdata()) == [4.0] and list(cross.get_ydata()) == [1.0]


def test_the_sweep_speedup_figure_has_no_ratio_where_the_base_has_no_token_itl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A base point whose replies each came in one read has no token ITL (None): no speedup is drawn
    there, and the figure is still drawn (the vLLM CPU K sweep met it under load: a TypeError)."""
    unmeasured = {"concurrency": 4, "itl_ms": dict.fromkeys(("p50", "p90", "p99")), "not_comparable": None}
    series = {
        "K0": [_point(1, 10.0), unmeasured, _point(16, 10.0)],
        "K3": [_point(c, 5.0) for c in (1, 4, 16)],
    }
    speedups = np.asarray(
        _speedup_lines(series, tmp_path, monkeypatch)["K3 over K0"].get_ydata(), dtype=float
    )
    assert speedups[[0, 2]] == pytest.approx([2.0, 2.0]) and np.isnan(speedups[1])


def _speedup_lines(
    series: dict[str, list[dict[str, Any]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[str, Any]:
    """The sweep speedup figure's lines by label, drawn from these points at concurrency 1, 4, 16."""
    from itlaudit.analysis.sweep import sweep_result
    from itlaudit.model.vocabulary import LoadAxis
    from itlaudit.report import sweep_plots

    sweep = sweep_result("s", LoadAxis.CONCURRENCY, [1, 4, 16], 1, series)
    drawn: list[Figure] = []
    monkeypatch.setattr(sweep_plots, "save_figure", lambda fig, path: drawn.append(fig) or path)
    sweep_plots.plot_speedup_vs_load(sweep, tmp_path / "s.png")
    return {str(line.get_label()): line for line in drawn[0].axes[0].get_lines()}


def test_bisect_marks_and_never_ranks_a_variant_that_breaks_the_rule() -> None:
    """--regress speedup over a probe whose K3 was capped: no speedup is judged (unknown, with the
    rule's reason), and the report marks that variant's figures."""
    from collections import Counter

    from itlaudit.bisect.build_range import Build
    from itlaudit.bisect.figures import Figures
    from itlaudit.bisect.report import render_markdown
    from itlaudit.bisect.settings import Settings
    from itlaudit.bisect.state import State
    from itlaudit.bisect.verdict import parse_regress

    def figures(itl: float, **found: int) -> Figures:
        return Figures([itl] * 8, [512] * 8, requests=8, errors=0, findings=Counter(found))

    capped = {"K0": figures(10.0), "K3": figures(3.0, truncated_below_max_tokens=8)}
    assert capped["K3"].validity(capped["K0"]) == Validity(False, "8 of 8 requests cut short")
    verdict = parse_regress("speedup").judge(capped, None, ["K0", "K3"], threshold=1.5, alpha=0.05)
    assert verdict == verdict.__class__(None, "K3 not comparable: 8 of 8 requests cut short")
    state = State(
        Settings(good="a1", bad="b2"),
        [Build("a1", "commit"), Build("b2", "commit")],
        probes=[{"index": 1, "verdict": "bad", "metrics": {n: f.summary() for n, f in capped.items()}}],
    )
    lines = render_markdown(state).splitlines()
    row = next(line for line in lines if line.startswith("| 1 |"))
    assert "| 10.00 | – | 512 | 3.00 ⚠ | – | 512 |" in row  # K0 clean, K3 marked (no chunk ITL given)
    assert (
        lines[-1] == "⚠ not comparable (cut short, failing or gibberish): #1 K3: 8 of 8 requests cut short."
    )


def test_compare_json_carries_the_reason_beside_the_speedups() -> None:
    """`compare` prints a variant's speedup only when compare.json says it is comparable."""
    from reportkit import k0_k3

    from itlaudit.analysis.comparison import build_comparison
    from itlaudit.analysis.derive import summarize_run

    records = k0_k3()
    rows = build_comparison(summarize_run(records), records, {}).variants
    assert [rows[n].not_comparable for n in ("K0", "K3")] == [None, None]
    assert rows["K3-capped"].not_comparable == "4 of 4 requests capped at 16 tokens"
    capped_base = [r for r in records if r.variant != "K0"]
    rows = build_comparison(summarize_run(capped_base, ["K3-capped", "K3"]), capped_base, {}).variants
    assert rows["K3"].not_comparable == "base K3-capped: 4 of 4 requests capped at 16 tokens"


def test_a_smoke_speedup_check_fails_for_a_capped_variant() -> None:
    """K3-capped is 2.9× "faster" than K0 per token: the gate fails it with the rule's reason
    instead of passing a speedup that is a cap."""
    from reportkit import k0_k3

    from itlaudit.analysis.derive import summarize_run
    from itlaudit.smoke.checks import evaluate, variant_figures
    from itlaudit.smoke.suite import CheckParams, CheckSpec, Suite

    records = k0_k3()
    blocks = summarize_run(records).variants
    ran = {
        name: variant_figures(name, [r for r in records if r.variant == name], block, None, [], 64)
        for name, block in blocks.items()
    }
    params = CheckParams(over="K0", min=2.0, metric="itl_ms.p50")
    check = CheckSpec("speedup", params, scenario="long")
    suite = Suite("s", Path("s.toml"), "", None, [], [], [check])
    by_variant = {r.variant: r for r in evaluate(suite, {"long": ran}, None)}
    assert by_variant["K3"].status == "PASS"
    capped = by_variant["K3-capped"]
    assert capped.status == "FAIL"
    assert capped.message == "this variant not comparable: 4 of 4 requests cut short, so no speedup"


DUMMY_SIM = Path(__file__).parent / "fixtures" / "track" / "nightly_sim.py"


def _launched(name: str, plan: Path, *extra: str) -> str:
    """A [[variants]] table launching the stand-in server with vLLM's dummy loader in its arguments."""
    argv = [
        sys.executable,
        str(DUMMY_SIM),
        "--plan",
        str(plan),
        "c1",
        "{port}",
        "--load-format",
        "dummy",
        *extra,
    ]
    return (
        f'[[variants]]\nname = "{name}"\n[variants.launch]\nkind = "command"\ncommand = {json.dumps(argv)}\n'
    )


@pytest.mark.parametrize("gate", ["relative", "strict"])
def test_dummy_weight_servers_are_compared_with_the_phrase_unless_strict(tmp_path: Path, gate: str) -> None:
    """K0 and K3 launched with `--load-format dummy`, both writing digit soup: compare gives the
    speedup and every output says "outputs are gibberish in both variants (…dummy weights…): speed
    compared, quality not judged"; meta.json records the loader. `--quality-gate strict` is the old
    rule: no ratio. Two launched stand-in servers, 3 requests of 256 tokens: about 6 s."""
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps(
            {"c1": {"step_ms": 1.0, "ttft_ms": 5.0, "gibberish_after_tokens": 0, "acceptance_prob": 0.8}}
        )
    )
    spec = '--speculative-config={"method":"mtp","num_speculative_tokens":3}'
    scenario = tmp_path / "dummy.toml"
    scenario.write_text(
        'name = "dummy"\nendpoint = "completions"\nmodel = "auto"\n'
        '[workload]\nprompts = ["Tell me about speculative decoding."]\n'
        "num_requests = 3\nmax_tokens = 256\nignore_eos = true\ntemperature = 0\n"
        + _launched("K0", plan)
        + _launched("K3", plan, spec.split("=", 1)[0], spec.split("=", 1)[1])
    )
    out = tmp_path / "run"
    done = itlaudit("compare", str(scenario), "--out", str(out), "--no-plots", "--quality-gate", gate)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    compared = json.loads((out / "compare.json").read_text())
    meta = json.loads((out / "meta.json").read_text())
    assert meta["quality_gate"] == gate
    assert {name: info.get("load_format") for name, info in meta["variants"].items()} == {
        "K0": "dummy",
        "K3": "dummy",
    }
    phrase = (
        "outputs are gibberish in both variants (K0, K3: dummy weights, --load-format dummy): "
        "speed compared, quality not judged"
    )
    report = (out / "report.md").read_text()
    if gate == "relative":
        assert compared["variants"]["K3"]["not_comparable"] is None and compared["quality"] == phrase
        assert re.search(r"K3: token-ITL speedup \d+\.\d\d×", done.stdout), done.stdout
        assert f"quality: {phrase}" in done.stdout and phrase in report
        assert json.loads((out / "summary.json").read_text())["dummy_weights"] == ["K0", "K3"]
        assert "**weights**: dummy (--load-format dummy): K0, K3" in report
    else:
        assert compared["variants"]["K3"]["not_comparable"] == (
            "3 of 3 requests look like gibberish; base K0: 3 of 3 requests look like gibberish"
        )
        assert compared.get("quality") is None and phrase not in report and "speedup" not in done.stdout


def test_a_sweep_judges_each_point_against_the_baselines_at_the_same_load(tmp_path: Path) -> None:
    """Sweep trials are one variant each: K3's gibberish counts against K0's at the same load. Both
    gibberish (dummy weights): comparable, so the crossover has its points; K3 gibberish where K0 is
    clean: not comparable. Trial folders written by hand, no server: well under a second."""
    from itlaudit.model.vocabulary import LoadAxis
    from itlaudit.store.rundir import write_versioned
    from itlaudit.workflows.sweep import POINT_FILE, SweepConfig, variant_points

    def trial(variant: str, gibberish: int) -> None:
        folder = tmp_path / variant / "c1-t1"
        folder.mkdir(parents=True)
        for name in ("requests.jsonl", "derived.jsonl"):
            (folder / name).write_text("")
        block = summary_block(requests=4, findings={"gibberish_suspected": gibberish} if gibberish else {})
        write_versioned(
            folder / "summary.json", RunSummary(variants={variant: block}, run_findings=[]).to_json()
        )
        write_versioned(folder / POINT_FILE, {"load": 1})

    config = SweepConfig(scenario="s", axis=LoadAxis.CONCURRENCY, values=[1], variants=["K0", "K3"])
    trial("K0", 4)
    trial("K3", 4)
    assert "not_comparable" not in variant_points(tmp_path, config, "K3")[1.0]
    assert "not_comparable" not in variant_points(tmp_path, config, "K0")[1.0]
    for variant in ("K0", "K3"):
        for path in sorted((tmp_path / variant).rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
    trial("K0", 0)
    trial("K3", 4)
    assert variant_points(tmp_path, config, "K3")[1.0]["not_comparable"] == (
        "4 of 4 requests look like gibberish where the baseline's do not"
    )
