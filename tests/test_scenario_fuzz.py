"""The scenario fuzz corpus (tests/fixtures/scenario_fuzz): every bad file is one line naming the
file and the line of the offending key (in the right [[variants]] table), exit 2, no traceback.

Each corpus file says what it expects in its first two lines: `# expect: <message fragment>` and
`# line: <line number>`."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from itlaudit.errors import ScenarioError
from itlaudit.model.scenario import load_scenario

CORPUS = sorted((Path(__file__).parent / "fixtures" / "scenario_fuzz").glob("*.toml"))


def _expected(path: Path) -> tuple[str, int]:
    head = path.read_text(encoding="utf-8").splitlines()[:2]
    fragment = re.match(r"# expect: (.+)$", head[0])
    line = re.match(r"# line: (\d+)$", head[1])
    assert fragment and line, f"{path}: corpus files start with `# expect:` and `# line:`"
    return fragment.group(1), int(line.group(1))


def test_corpus_covers_the_cases_of_issue_10() -> None:
    names = {p.stem for p in CORPUS}
    assert {
        "binary_prompts_file",
        "workload_is_a_number",
        "variants_are_numbers",
        "dollar_math_in_variant_name",
        "negative_min_tokens",
        "min_tokens_above_max_tokens",
        "empty_variant_name",
        "error_in_second_variant",
    } <= names


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_bad_scenario_names_file_line_and_problem(path: Path) -> None:
    fragment, line = _expected(path)
    with pytest.raises(ScenarioError) as raised:
        load_scenario(path)
    message = str(raised.value)
    assert message.startswith(f"{path}:{line}: "), message
    assert fragment in message
    assert "\n" not in message


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_bad_scenario_through_the_cli_is_one_line_exit_2(path: Path, tmp_path: Path) -> None:
    fragment, line = _expected(path)
    result = subprocess.run(
        [sys.executable, "-m", "itlaudit", "run", str(path), "--url", "http://127.0.0.1:9"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"{path}:{line}: " in lines[0] and fragment in lines[0]
    assert list(tmp_path.iterdir()) == []  # nothing written anywhere
