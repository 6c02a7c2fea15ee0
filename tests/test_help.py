"""Every command's --help reads like a Unix tool's: no Python type tags, no `--no-no-` pairs, brackets
shown as typed; choices listed and refused; `itlaudit --version`; usage errors are one line, exit 2."""

from __future__ import annotations

import re

import pytest
import typer
from simkit import itlaudit

from itlaudit import __version__
from itlaudit.cli.app import app

TAGS = re.compile(r"<bool>|<str>|<int>|<float>|<path>|<list")


def _command_paths() -> list[list[str]]:
    """Every command and sub-command, as the words that name it."""
    paths: list[list[str]] = [[]]

    def walk(command: object, prefix: list[str]) -> None:
        for name, sub in getattr(command, "commands", {}).items():
            paths.append([*prefix, name])
            walk(sub, [*prefix, name])

    walk(typer.main.get_command(app), [])
    return paths


@pytest.mark.parametrize("words", _command_paths(), ids=lambda words: " ".join(words) or "itlaudit")
def test_help_has_no_type_tags_and_clean_flag_pairs(words: list[str]) -> None:
    result = itlaudit(*words, "--help")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "Usage: itlaudit" in text
    assert not TAGS.search(text), TAGS.search(text)
    (usage,) = [line for line in text.splitlines() if "Usage:" in line]
    assert "{" not in usage, usage  # typer's {name} for a required argument
    assert "--no-no-" not in text and "ignore-ignore" not in text
    assert "[default: no-" not in text  # an off switch is a bare flag, not a --no- pair


def test_commands_are_grouped_and_brackets_survive_the_markup() -> None:
    text = itlaudit("--help").stdout
    panels = [line for line in text.splitlines() if line.startswith("╭─")]
    assert [p.split("─")[1].strip() for p in panels] == [
        "Options",
        "Measure",
        "Read results",
        "Gate a release",
        "Tools",
    ]
    # usage lines name positionals in capitals, optional ones in brackets
    assert "Usage: itlaudit run [OPTIONS] [SCENARIO]" in itlaudit("run", "--help").stdout
    assert "Usage: itlaudit diff [OPTIONS] BASE_DIR NEW_DIR" in itlaudit("diff", "--help").stdout
    assert "[VARIANT=]FILE" in itlaudit("report", "--help").stdout
    assert "[DONE]" in itlaudit("sim", "--help").stdout


def test_bisect_options_come_in_panels() -> None:
    text = itlaudit("bisect", "--help").stdout
    for panel in ("General", "Build provider", "Verdict", "Output"):
        assert f"╭─ {panel} " in text, panel


def test_version_flag_and_command() -> None:
    assert itlaudit("--version").stdout.strip() == __version__
    assert itlaudit("version").stdout.strip() == __version__


@pytest.mark.fault_row("G1")
@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["run", "--url", "http://127.0.0.1:9", "--stamp", "nope"], "'nope' is not one of 'kernel', 'loop'"),
        (
            ["run", "--url", "http://127.0.0.1:9", "--endpoint", "x"],
            "'x' is not one of 'completions', 'chat'",
        ),
        (["run", "--url", "http://127.0.0.1:9", "--dataset-name", "x"], "'random', 'jsonl', 'sharegpt'"),
        (["export", ".", "--format", "xls"], "'csv', 'parquet'"),
        (["bisect", "--from", "a", "--to", "b", "--provider", "x"], "'x' is not one of"),
        (["diff", ".", ".", "--fail-on", "x"], "'x' is not one of"),
        (["bisect", "--from", "a", "--to", "b", "--trials", "x"], "--trials x: must be a whole number"),
        (["run", "--url", "http://127.0.0.1:9", "--goodput", "itl:3"], "cannot read 'itl:3'"),
        (["run", "--url", "http://127.0.0.1:9", "--metric-percentiles", "101"], "'101' is not a percentile"),
    ],
)
def test_a_bad_choice_is_refused_in_one_line(args: list[str], needle: str) -> None:
    result = itlaudit(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("itlaudit: error:"), result.stderr
    assert needle in lines[0]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["run", "--url", "localhost:8000"], "--url 'localhost:8000': URL needs http:// or https://"),
        (["run", "--variant", "K0=localhost:8000"], "URL needs http:// or https://"),
        (["smoke", "--url", "localhost:8000"], "URL needs http:// or https://"),
        (["run", "--cluster", "nowhere", "--url", "http://127.0.0.1:9"], "--cluster 'nowhere'"),
    ],
)
def test_a_url_without_scheme_says_so(args: list[str], needle: str) -> None:
    result = itlaudit(*args)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [result.stderr.strip()], result.stderr
    assert needle in result.stderr


def test_the_option_table_in_the_docs_is_the_parsers() -> None:
    """docs/options.md is generated from the parser (`python -m itlaudit.cli.reference`): an option
    added, renamed or re-described without regenerating it fails here (issue 36 item 3)."""
    from pathlib import Path

    from itlaudit.cli.reference import option_table

    page = Path(__file__).resolve().parents[1] / "docs" / "options.md"
    assert page.read_text() == option_table(), (
        "regenerate: .venv/bin/python -m itlaudit.cli.reference > docs/options.md"
    )
    # One name, one meaning: each option shared by commands takes the same value everywhere (and
    # --trials/--max-trials the same help), and `--version` is only the program's own.
    rows = [line.split(" | ") for line in option_table().splitlines() if line.startswith("| itlaudit ")]
    shared = ("--variant", "--only", "--trials", "--max-trials", "--provider", "--api-key", "--header")
    shared += (
        "--goodput",
        "--metric-percentiles",
        "--percentile-metrics",
        "--fail-on-findings",
        "--threshold",
    )
    for name in shared:
        seen = {
            (value, help_ if name in ("--trials", "--max-trials") else "")
            for _, o, value, help_ in rows
            if f"`{name}`" in o
        }
        assert len(seen) == 1, (name, seen)
    assert not [row for row in rows if "`--version`" in row[1]]
