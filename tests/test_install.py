"""The project as a user gets it: `pip install` into a fresh venv, then the console script.

Nothing from the development venv leaks in (a package imported but not declared would be missing
here), which is how a fresh install came to lack click while this venv still had it.
"""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.heavy  # pip-installs itlaudit into a fresh venv


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The console script of a fresh venv with the project installed (one install per module)."""
    env_dir = tmp_path_factory.mktemp("fresh-venv")
    venv.create(env_dir, with_pip=True)
    pip = subprocess.run(
        [str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q", str(ROOT)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert pip.returncode == 0, f"pip install failed:\n{pip.stdout[-2000:]}\n{pip.stderr[-2000:]}"
    return env_dir / "bin" / "itlaudit"


def _run(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(script), *args], capture_output=True, text=True, check=False, timeout=120)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["run", "x.toml", "--no-such-flag"], "No such option: --no-such-flag"),
        (["run"], "give a SCENARIO file, or a server: --url URL, or --variant NAME=URL"),
        (["no-such-command"], "No such command"),
        (["sim", "--port", "abc"], "Invalid value for '--port'"),
    ],
    ids=["bogus-flag", "no-workload", "bogus-command", "bad-value"],
)
def test_usage_errors_of_the_installed_script_are_one_line_exit_2(
    installed: Path, args: list[str], fragment: str
) -> None:
    result = _run(installed, *args)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("itlaudit: error: ") and fragment in lines[0]
    assert "Traceback" not in result.stderr + result.stdout


def test_installed_script_imports_every_command_module(installed: Path) -> None:
    """`--help` of each command imports what that command needs at parse time."""
    for command in ("run", "compare", "diff", "report", "bisect", "smoke", "invariance", "ledger"):
        result = _run(installed, command, "--help")
        assert result.returncode == 0, f"{command}: {result.stderr}"
    assert sys.executable not in installed.read_text()  # it is the fresh venv's own script
    # `track publish` works from the default install: plotly is a dependency, not an extra.
    charts = subprocess.run([str(installed.parent / "python"), "-c", "import plotly.offline"], check=False)
    assert charts.returncode == 0
