"""One set of findings in every output of a run (issue 34): a real `compare` against simulators that
each fault in their own way fires request-, variant- and comparison-scope codes, and the terminal
block, the compare lines, report.md, report.html, summary.json, compare.json and derived.jsonl all
name every code that fired, at the same severity where they state one; "No findings" and "Findings:
none" appear only in a run with none anywhere (its clean neighbour). About 15 s: nine in-process
simulators, 3 requests of up to 256 tokens each."""

from __future__ import annotations

import json
import re
from contextlib import ExitStack
from pathlib import Path

from simkit import itlaudit, sim_server

from itlaudit.report.markdown import NO_FINDINGS
from itlaudit.serve.sim import SimConfig

FAST = {"step_ms": 1.0, "ttft_ms": 2.0}
# Each variant's server and the codes it must fire (K0, the baseline, is clean).
FAULTS: dict[str, tuple[SimConfig, set[str]]] = {
    "K0": (SimConfig(**FAST), set()),
    "CAP": (SimConfig(**FAST, cap_tokens=16), {"truncated_below_max_tokens", "common_cap"}),
    "GIB": (SimConfig(**FAST, gibberish_after_tokens=0), {"gibberish_suspected"}),
    "EOS": (
        SimConfig(**FAST, num_speculative_tokens=3, natural_eos_at=7),
        {"spec_decode_output_mismatch"},
    ),
    "LIE": (
        SimConfig(
            **FAST,
            num_speculative_tokens=3,
            acceptance_prob=0.5,
            per_request_spec_metrics=True,
            spec_metrics_lie=True,
        ),
        {"spec_decode_metrics_disagree"},
    ),
    "NOUSE": (SimConfig(**FAST, drop_usage=True), {"usage_missing"}),
    "NODONE": (SimConfig(**FAST, no_done=True), {"no_done_sentinel"}),
    "ERR": (SimConfig(**FAST, error_after_tokens=5), {"stream_error"}),
}
WORKLOAD = [
    "--num-prompts",
    "3",
    "--random-output-len",
    "256",
    "--temperature",
    "0",
    "--no-distribution-audit",
]


def _compare(
    tmp_path: Path, variants: dict[str, SimConfig], workload: list[str] = WORKLOAD
) -> tuple[str, Path]:
    out = tmp_path / "run"
    with ExitStack() as stack:
        urls = {name: stack.enter_context(sim_server(config)) for name, config in variants.items()}
        args = [a for name, url in urls.items() for a in ("--variant", f"{name}={url}")]
        done = itlaudit("compare", *args, *workload, "--out", str(out), "--no-plots")
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout, out


def _summary_codes(out: Path) -> dict[str, set[str]]:
    """Per variant, the codes summary.json counts in its block."""
    summary = json.loads((out / "summary.json").read_text())
    return {name: set(block["findings"]) for name, block in summary["variants"].items()}


def test_every_fired_code_is_named_in_every_output(tmp_path: Path) -> None:
    stdout, out = _compare(tmp_path, {name: config for name, (config, _) in FAULTS.items()})
    counted = _summary_codes(out)
    for name, (_, codes) in FAULTS.items():
        assert codes <= counted[name], (name, counted[name])
    fired = set().union(*counted.values())
    assert fired >= set().union(*(codes for _, codes in FAULTS.values()))
    report_md = (out / "report.md").read_text()
    report_html = (out / "report.html").read_text()
    derived = {
        c for line in (out / "derived.jsonl").read_text().splitlines() for c in json.loads(line)["findings"]
    }
    compared = json.loads((out / "compare.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    for code in fired:
        assert code in report_md and code in report_html, code
        assert re.search(rf"Findings:\s.*{code}×", stdout), code  # the terminal block's Findings row
    # A comparison finding is compare.json's and summary.json's, with the same severity, and is named
    # in the compare command's lines too.
    for finding in compared["findings"]:
        assert finding in summary["run_findings"], finding["code"]
        assert finding["code"] in stdout
    mismatch = next(f for f in compared["findings"] if f["code"] == "spec_decode_output_mismatch")
    assert mismatch["severity"] == "error" and mismatch["message"].count("Conclusion:") == 1
    # Request-level codes are each request's line in derived.jsonl as well.
    assert {"usage_missing", "no_done_sentinel", "stream_error", "truncated_below_max_tokens"} <= derived
    assert NO_FINDINGS not in report_md and "No findings" not in report_html
    assert stdout.count("Findings:                                none") == 1  # the clean K0's block only
    # The gibberish variant against a clean baseline is not comparable, everywhere it is ranked.
    assert compared["variants"]["GIB"]["not_comparable"] == (
        "3 of 3 requests look like gibberish where the baseline's do not"
    )
    assert "GIB: not comparable: 3 of 3 requests look like gibberish" in stdout


def test_a_clean_run_says_no_findings_in_every_output(tmp_path: Path) -> None:
    """The clean pair streams a 20 ms token ITL (K3: four tokens an 80 ms step), 48 tokens in ~1 s: at the
    1 ms steps of the faults above, K3's 0.25 ms token ITL made `client_saturated` (loop lag over 5 % of
    it) fire, truly, whenever the 2-core CI box was busy."""
    clean = {
        "K0": SimConfig(step_ms=20.0, ttft_ms=2.0),
        "K3": SimConfig(step_ms=80.0, ttft_ms=2.0, num_speculative_tokens=3),
    }
    stdout, out = _compare(tmp_path, clean, [*WORKLOAD[:2], "--random-output-len", "48", *WORKLOAD[4:]])
    assert _summary_codes(out) == {"K0": set(), "K3": set()}
    assert json.loads((out / "compare.json").read_text())["findings"] == []
    assert NO_FINDINGS in (out / "report.md").read_text()
    assert stdout.count("Findings:                                none") == 2


def test_a_server_that_truncates_the_prompt_is_a_finding_and_the_block_says_so(tmp_path: Path) -> None:
    """vLLM's `truncate_prompt_tokens` (sent through extra_body) makes the server keep 7 of the 32 token
    ids: prompt_tokens_mismatch on every request, and the result block gives the sent total beside the
    server's; the same workload without it is quiet. Two runs of 3 requests on one simulator: ~2 s."""
    scenario = tmp_path / "s.toml"
    body = (
        'name = "p"\nendpoint = "completions"\nmodel = "auto"\n[workload]\nnum_requests = 3\n'
        '[workload.dataset]\nkind = "random"\ninput_len = 32\noutput_len = 16\n{extra}'
        '[[variants]]\nname = "K0"\nurl = "{url}"\n'
    )
    with sim_server(SimConfig(**FAST)) as url:
        found = {}
        for name, extra in (("cut", "[workload.extra_body]\ntruncate_prompt_tokens = 7\n"), ("whole", "")):
            scenario.write_text(body.replace("{extra}", extra).replace("{url}", url))
            done = itlaudit("run", str(scenario), "--out", str(tmp_path / name), "--no-plots")
            assert done.returncode == 0, done.stdout + done.stderr
            found[name] = (done.stdout, _summary_codes(tmp_path / name)["K0"])
    stdout, codes = found["cut"]
    assert codes == {"prompt_tokens_mismatch"}
    assert re.search(r"Total input tokens:\s+21\n", stdout) and re.search(
        r"Input tokens sent \(the server counted\):\s+96\s+21", stdout
    ), stdout
    assert (
        "counted 7 prompt tokens for a prompt of 32 token ids" in (tmp_path / "cut" / "report.md").read_text()
    )
    stdout, codes = found["whole"]
    assert codes == set() and "Input tokens sent" not in stdout


def test_compare_fails_on_a_comparison_finding_when_asked(tmp_path: Path) -> None:
    """`compare --fail-on-findings` exits 1 on a lossless mismatch alone (a comparison finding, counted
    with the run's), 0 on a clean pair. Two compares of 3 requests: ~3 s."""
    k0, eos = FAULTS["K0"][0], FAULTS["EOS"][0]
    for name, k3, code in (("clean", SimConfig(**FAST, num_speculative_tokens=3), 0), ("eos", eos, 1)):
        with sim_server(k0) as k0_url, sim_server(k3) as k3_url:
            out = tmp_path / name
            args = ["--variant", f"K0={k0_url}", "--variant", f"K3={k3_url}", *WORKLOAD, "--out", str(out)]
            done = itlaudit("compare", *args, "--no-plots", "--fail-on-findings")
        assert done.returncode == code, (name, done.stdout + done.stderr)


def test_diff_names_the_comparison_findings_that_appeared(tmp_path: Path) -> None:
    """`diff` of a clean compare against one whose K3 left K0's greedy text: the lossless mismatch
    compare.json holds is among the findings that appeared, as the new run's report names it. ~3 s."""
    k3 = SimConfig(**FAST, num_speculative_tokens=3)
    _, base = _compare(tmp_path / "base", {"K0": FAULTS["K0"][0], "K3": k3})
    _, new = _compare(tmp_path / "new", {"K0": FAULTS["K0"][0], "K3": FAULTS["EOS"][0]})
    done = itlaudit("diff", str(base), str(new))
    assert done.returncode == 0, done.stdout + done.stderr
    appeared = done.stdout[done.stdout.index("Findings that appeared") :]
    assert "spec_decode_output_mismatch" in appeared, done.stdout


def test_a_report_written_elsewhere_is_the_report_written_in_place(tmp_path: Path) -> None:
    """`report RUN --out DIR` writes what `report RUN` writes in the run folder: the context block, the
    findings compare.json added, the server section (issue 36 item 5). One compare: ~2 s."""
    _, run = _compare(tmp_path, {"K0": FAULTS["K0"][0], "K3": FAULTS["EOS"][0]})
    elsewhere = tmp_path / "elsewhere"
    for args in ([str(run)], [str(run), "--out", str(elsewhere)]):
        done = itlaudit("report", *args)
        assert done.returncode == 0, done.stdout + done.stderr
    in_place = (run / "report.md").read_text()
    assert (elsewhere / "report.md").read_text() == in_place
    assert "spec_decode_output_mismatch" in in_place and "## Server during the measured window" in in_place
    assert json.loads((elsewhere / "summary.json").read_text()) == json.loads(
        (run / "summary.json").read_text()
    )
