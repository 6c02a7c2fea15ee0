"""Start-up stays cheap: the CLI's import and its --help load none of the heavy libraries, and
`run --no-plots` writes its report without drawing (issue 24 item 6).

Structural, not timed: a module in sys.modules is there on any machine, loaded or not, while a
start-up time on a shared box is the box's. benchmarks/startup.py holds the timings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer
import typer.main
from simkit import sim_server

from itlaudit.cli.app import COMMANDS
from itlaudit.cli.style import Entry, LazyRoot
from itlaudit.report.markdown import escape
from itlaudit.report.writer import PLOTS_SKIPPED, REPORT_HTML, REPORT_MD
from itlaudit.serve.sim import SimConfig

# Each costs a tenth of a second to seconds to import; none is needed to parse a command line.
HEAVY = ("pandas", "matplotlib", "scipy", "ray", "prometheus_client", "aiohttp", "plotly")
# What a command line must not load even when the command runs, as long as it does not draw.
DRAWING = ("matplotlib",)


def _loaded_after(code: str, names: tuple[str, ...], *, cwd: Path | None = None) -> list[str]:
    """Which of `names` a fresh interpreter has imported once `code` ran (whatever it exited with):
    printed at exit, as the last line of its stdout."""
    script = (
        "import atexit, json, sys\n"
        f"atexit.register(lambda: print(json.dumps(sorted(m for m in {names!r} if m in sys.modules))))\n"
        f"{code}"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=cwd, check=False
    )
    lines = done.stdout.strip().splitlines()
    assert lines and lines[-1].startswith("["), f"no module list printed:\n{done.stdout}\n{done.stderr}"
    return list(json.loads(lines[-1]))


def test_importing_the_cli_loads_no_heavy_library() -> None:
    assert _loaded_after("import itlaudit.cli.app", HEAVY) == []


def test_help_of_every_command_loads_no_heavy_library() -> None:
    """typer evaluates each command's annotations and defaults to print its help: that must not pull
    the stacks in either."""
    commands = ["run", "compare", "sweep", "invariance", "report", "quality", "smoke", "bisect", "sim"]
    code = (
        "import sys\nfrom itlaudit.cli.app import main\n"
        f"for command in {commands!r}:\n"
        "    sys.argv = ['itlaudit', command, '--help']\n"
        "    try:\n        main()\n    except SystemExit:\n        pass\n"
        "sys.argv = ['itlaudit', '--help']\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
    )
    assert _loaded_after(code, HEAVY) == []


def test_the_command_list_imports_no_command() -> None:
    """`itlaudit --help` is drawn from cli/app.py's table (cli/style.py's LazyRoot): no command's
    module is imported, nor numpy and the stages' stacks they bring (0.45-0.68 s before, here)."""
    modules = sorted({entry.target.split(":")[0] for entry in COMMANDS} - {"itlaudit.cli.app"})
    names = (*modules, "numpy", "itlaudit.capture.runner", "itlaudit.workflows.run", *HEAVY)
    code = "import sys\nfrom itlaudit.cli import main\nsys.argv = ['itlaudit', '--help']\nmain()\n"
    assert len(modules) >= 8
    assert _loaded_after(code, names) == []
    # and a command's own --help loads that command's module (and not the others)
    run_help = code.replace("'--help'", "'run', '--help'")
    assert _loaded_after(run_help, tuple(modules)) == ["itlaudit.cli.run"]


def test_run_help_loads_no_capture_stage_and_no_numpy() -> None:
    """`run --help` (issue 38 item 4: 0.4-0.6 s on the GPU host through cli/options -> capture/runner,
    and cli/bench_flags -> store/result) draws its options from their defaults alone: neither the
    capture stage, the analysis nor numpy is loaded (0.56 -> 0.35 s of CPU on the 2-core box)."""
    code = "import sys\nfrom itlaudit.cli import main\nsys.argv = ['itlaudit', 'run', '--help']\nmain()\n"
    names = (
        "numpy",
        "itlaudit.capture.runner",
        "itlaudit.telemetry.metrics_sampler",
        "itlaudit.analysis.metrics",
    )
    assert _loaded_after(code, (*names, *HEAVY)) == []


def test_the_root_takes_its_commands_from_the_table_only() -> None:
    """A command registered with app.command() would be neither listed nor found by the lazy root:
    it is refused when the app is built, not lost."""

    class Root(LazyRoot):
        entries = (Entry("version", "itlaudit.cli.app:version", "Tools", "Print the version."),)

    app = typer.Typer(cls=Root)
    app.callback()(lambda: None)
    assert list(typer.main.get_group(app).commands) == ["version"]

    @app.command()
    def extra() -> None:
        """Not in the table."""

    with pytest.raises(TypeError, match=r"\['extra'\]: a root command is a row of the table"):
        typer.main.get_group(app)


def test_the_console_script_module_level_loads_no_cli() -> None:
    """The `itlaudit` script imports `itlaudit.cli.main` at module level, and a capture worker
    (forkserver) re-runs that before its target: the CLI must load only when main() runs, so a worker
    starts in milliseconds instead of importing typer, rich and every command."""
    names = ("itlaudit.cli.app", "typer", "rich", *HEAVY)
    assert _loaded_after("from itlaudit.cli import main", names) == []


def test_the_probe_sees_a_heavy_import() -> None:
    """The check can fail: a command line that does load pandas is seen doing so."""
    assert _loaded_after("import itlaudit.cli.app\nimport pandas", HEAVY) == ["pandas"]


def _scenario(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "s.toml"
    path.write_text(
        'name = "t"\nendpoint = "completions"\n\n[workload]\nprompts = ["Tell me a story about a dog."]\n'
        f'num_requests = 3\nconcurrency = 2\nmax_tokens = 40\ntemperature = 0\n\n[[variants]]\nname = "A"\n'
        f'url = "{url}"\n',
        encoding="utf-8",
    )
    return path


def _run(tmp_path: Path, *flags: str) -> tuple[Path, list[str]]:
    with sim_server(SimConfig(step_ms=5.0)) as url:
        scenario = _scenario(tmp_path, url)
        out = tmp_path / f"run{'-'.join(flags)}"
        argv = ["itlaudit", "run", str(scenario), "--out", str(out), "--ledger", str(tmp_path / "l.jsonl")]
        code = (
            f"import sys\nfrom itlaudit.cli.app import main\nsys.argv = {[*argv, *flags]!r}\n"
            "try:\n    main()\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
        )
        loaded = _loaded_after(code, DRAWING, cwd=tmp_path)
    return out, loaded


def test_no_plots_writes_the_report_without_drawing(tmp_path: Path) -> None:
    out, loaded = _run(tmp_path, "--no-plots")
    assert loaded == []
    assert list(out.glob("*.png")) == []
    label, text = PLOTS_SKIPPED
    assert f"**{label}**: {escape(text)}" in (out / REPORT_MD).read_text(encoding="utf-8")
    page = (out / REPORT_HTML).read_text(encoding="utf-8")
    assert text in page
    assert "<img" not in page


def test_a_run_draws_its_plots_by_default(tmp_path: Path) -> None:
    out, loaded = _run(tmp_path)
    assert loaded == ["matplotlib"]
    assert list(out.glob("*.png"))
    assert PLOTS_SKIPPED[1] not in (out / REPORT_MD).read_text(encoding="utf-8")
    assert "<img" in (out / REPORT_HTML).read_text(encoding="utf-8")
