"""The bare `itlaudit bisect --from A --to B`: the bundled seed scenario, the commit list from GitHub's
compare API (a local stand-in answering in GitHub's layout, paged, with merge commits), and the
`auto` verdict naming the signal that flipped at the first bad build.

Whole bisections use the `command` provider serving each commit with the simulator and a test-size
two-variant scenario (K0 and K3 per probe); the bare default scenario is checked with --dry-run. The
simulator decodes at 1 ms per step, where a loaded 2-core machine adds tens of percent of noise, so
those runs judge ITL at --threshold 2.5 and the ITL culprit is a 4x slower step.
"""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

import pytest

from itlaudit import cli
from itlaudit.bisect.github import commits_from_github

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "bisect"))
from github_api import CompareServer, make_history, serve_compare
from helpers import FAKE_VLLM, FIXTURES, make_wheel, serve_dir, wheel_entry, write_metadata

PY = sys.executable
TOKEN = "ghp_itlauditTestToken0123456789abcdef"
K0_K3 = FIXTURES / "probe-k0-k3.toml"


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not in a git clone (so the range must come from the API), a private itlaudit cache."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ITLAUDIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("GITHUB_TOKEN", raising=False)


def _bisect(monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    monkeypatch.setattr(sys, "argv", ["itlaudit", "bisect", *args])
    try:
        cli.main()
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def _range(history_count: int) -> tuple[CompareServer, list[str]]:
    """A history with merges and the first-parent range from mainline[2] to its head (with 110
    mainline commits the range, side commits included, spans two pages)."""
    history = make_history(history_count)
    return CompareServer(history), history.mainline[2:]


def test_first_parent_chain_over_pages_is_cached_and_the_token_stays_in_the_header(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, chain = _range(110)
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    with serve_compare(server):
        builds = commits_from_github(server.url, server.repo, chain[0][:9], chain[-1][:9], tmp_path / "c")
        asked = len(server.requests)
        again = commits_from_github(server.url, server.repo, chain[0][:9], chain[-1][:9], tmp_path / "c")
    assert [b.ref for b in builds] == chain == [b.ref for b in again]
    side = set(server.history.side)
    assert side & set(server.history.ancestors(chain[-1])) and not side & {b.ref for b in builds}
    assert [r["query"] for r in server.requests] == ["per_page=100&page=1", "per_page=100&page=2"]
    assert asked == 2  # the second call was answered from the cache
    assert {r["authorization"] for r in server.requests} == {f"Bearer {TOKEN}"}
    cached = list((tmp_path / "c").rglob("*.json"))
    assert len(cached) == 1 and TOKEN not in cached[0].read_text()


def _wheel_index(root: Path, commits: list[str]) -> None:
    """wheels.vllm.ai's layout for a few commits: metadata.json naming a wheel for this machine."""
    for sha in commits:
        wheel = make_wheel(
            root / sha / "cu130", "vllm", f"0.23.1rc1.dev1+g{sha[:9]}", f"manylinux_2_31_{platform.machine()}"
        )
        write_metadata(root, sha, "cu130", [wheel_entry(wheel, "cu130", f"../{wheel.name}")])


def test_bare_command_dry_run_resolves_the_seed_scenario_and_the_github_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    server, chain = _range(110)
    _wheel_index(tmp_path / "wheels", [chain[0], chain[40], chain[-1]])
    with serve_compare(server), serve_dir(tmp_path / "wheels") as wheels_url:
        code = _bisect(
            monkeypatch,
            "--from", chain[0][:9], "--to", chain[-1][:9],
            "--github-api", server.url, "--wheels-url", wheels_url, "--dry-run",
        )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert f"{len(chain)} builds from GitHub compare API {server.url}" in out
    assert "bisect-seed-mtp-long-decode" in out and "variants K0, K3" in out
    assert "model nvidia/Qwen3.6-35B-A3B-NVFP4" in out and "8 requests × 1024 tokens" in out
    assert f"{chain[40][:12]} found: cu130: vllm-0.23.1rc1.dev1+g{chain[40][:9]}" in out
    assert f"{chain[1][:12]} missing: no wheel for {chain[1][:9]}" in out
    assert f"3 of {len(chain)} builds found" in out
    assert "expected probes: ~9" in out and "expected download: ~" in out
    assert not (tmp_path / "reports").exists() and not (tmp_path / "cache" / "bisect").exists()


@pytest.mark.heavy  # tens of seconds of simulated servers
@pytest.mark.parametrize(
    ("count", "culprit", "mode", "signal", "says"),
    [
        (
            110,  # two pages of the compare API
            71,
            "cap",
            "truncation",
            ["outputs capped at 128 tokens (was 160)", "token ITL unchanged", "chunk ITL is K3's ("],
        ),
        (30, 17, "slow", "itl", ["token ITL up", "outputs full length (160 tokens)"]),
    ],
)
def test_bare_command_finds_the_culprit_and_names_the_flipped_signal(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    count: int,
    culprit: int,
    mode: str,
    signal: str,
    says: list[str],
) -> None:
    server, chain = _range(count)
    commits = tmp_path / "first-parent.txt"
    commits.write_text("".join(f"{s}\n" for s in chain))
    command = (
        f"{PY} {FAKE_VLLM} serve --commits {commits} --bad-from {culprit} --mode {mode} {{commit}} {{port}}"
    )
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    with serve_compare(server):
        code = _bisect(
            monkeypatch,
            "--from", chain[0][:9], "--to", chain[-1][:9], "--github-api", server.url,
            "--provider", "command", "--server-cmd", command, "--scenario", str(K0_K3),
            "--trials", "2", "--threshold", "2.5", "--out", str(tmp_path / "b"),
        )  # fmt: skip
    assert code == 0
    state = json.loads((tmp_path / "b" / "bisect.json").read_text())
    assert state["first_bad"] == chain[culprit] and state["last_good"] == chain[culprit - 1]
    assert state["signals"] == [signal]
    explanation = state["explanation"]
    assert explanation.startswith(f"{chain[culprit][:9]}: K0: ")
    for text in says:
        assert text in explanation
    for probe in state["probes"]:
        assert set(probe["metrics"]) == {"K0", "K3"}
        folder = Path(probe["dir"])
        assert (folder / "server-K0.log").is_file() and (folder / "server-K3.log").is_file()
    printed = capsys.readouterr().out
    assert f"first bad build: {chain[culprit][:9]}" in printed and explanation in printed
    assert "What changed: " + explanation in (tmp_path / "b" / "report.md").read_text()
    assert {r["authorization"] for r in server.requests} == {f"Bearer {TOKEN}"}
    for path in [*(tmp_path / "b").rglob("*"), *(tmp_path / "cache").rglob("*")]:
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path


@pytest.mark.parametrize(
    ("rate_limited", "message"),
    [
        (False, "GitHub compare API: deadbeef0...{head} not found in vllm-project/vllm (HTTP 404: No commit"),
        (True, "GitHub API rate limit reached (HTTP 403) until "),
    ],
)
def test_compare_api_errors_are_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], rate_limited: bool, message: str
) -> None:
    server, chain = _range(12)
    server.rate_limited = rate_limited
    with serve_compare(server):
        code = _bisect(monkeypatch, "--from", "deadbeef0", "--to", chain[-1][:9], "--github-api", server.url)
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("itlaudit: error: " + message.replace("{head}", chain[-1][:9]))
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "set GITHUB_TOKEN" in err if rate_limited else "check the shas" in err


def test_a_scenario_without_a_model_asks_for_model_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    server, chain = _range(12)
    with serve_compare(server):
        code = _bisect(
            monkeypatch, "--from", chain[0], "--to", chain[-1], "--github-api", server.url,
            "--scenario", str(FIXTURES / "probe.toml"),
        )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "names no model to serve; pass --model" in err
    assert server.requests == []  # refused before the range was even asked for
