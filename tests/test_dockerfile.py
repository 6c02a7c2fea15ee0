"""Dockerfile.aarch64 cannot be built here (no Docker engine, no aarch64 GPU): parse it into
instructions and shell commands and check what can be checked statically, so an edit that breaks the
recipe fails CI rather than a DGX Spark user."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile.aarch64"
KNOWN = {"ARG", "FROM", "COPY", "RUN", "WORKDIR", "ENTRYPOINT", "CMD", "ENV", "LABEL"}


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case, as Docker treats keywords case-insensitively
    arguments: str  # continuation lines joined, runs of whitespace as one space

    def exec_form(self) -> list[str] | None:
        """The JSON array of `CMD ["a", "b"]`, or None for the shell form."""
        if not self.arguments.startswith("["):
            return None
        value = json.loads(self.arguments)
        assert isinstance(value, list) and all(isinstance(v, str) for v in value), self
        return value

    def commands(self) -> list[list[str]]:
        """A shell-form RUN as its `&&`-chained commands, each split into words as sh would."""
        lexer = shlex.shlex(self.arguments, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        commands: list[list[str]] = [[]]
        for token in lexer:
            if token == "&&":
                commands.append([])
            else:
                assert token not in {";", "|", "||", "&"}, f"RUN chains only with &&: {self.arguments}"
                commands[-1].append(token)
        return commands


def parse_dockerfile(text: str) -> list[Instruction]:
    """Docker's own rules: `#` lines are comments (inside a continuation too), a trailing `\\` joins
    the next line, the first word is the keyword."""
    logical: list[str] = []
    pending = ""
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    logical.append(pending)
    out = []
    for line in logical:
        if line.strip():
            keyword, _, rest = line.strip().partition(" ")
            out.append(Instruction(keyword.upper(), " ".join(rest.split())))
    return out


def dockerfile() -> list[Instruction]:
    return parse_dockerfile(DOCKERFILE.read_text(encoding="utf-8"))


def copies() -> list[tuple[list[str], str]]:
    """(sources, destination) of every COPY."""
    out = []
    for step in dockerfile():
        if step.keyword == "COPY":
            words = [w for w in (step.exec_form() or shlex.split(step.arguments)) if not w.startswith("--")]
            out.append((words[:-1], words[-1]))
    return out


def one(keyword: str) -> Instruction:
    matches = [step for step in dockerfile() if step.keyword == keyword]
    assert len(matches) == 1, f"expected one {keyword}, found {len(matches)}"
    return matches[0]


def source_dir() -> str:
    """Where the build context's pyproject.toml lands: the directory pip installs from."""
    (destination,) = {dest for sources, dest in copies() if "pyproject.toml" in sources}
    return destination.rstrip("/")


# --- the parser itself ------------------------------------------------------------------------------


def test_parser_joins_continuations_drops_comments_and_reads_both_forms() -> None:
    steps = parse_dockerfile(
        "# syntax comment\nARG A=1\nfrom base:${A}\nRUN a x \\\n# inside\n    && b 'y z' \\\n    && c\n"
        'CMD ["smoke", "--help"]\n\nENTRYPOINT itlaudit\n'
    )
    assert [s.keyword for s in steps] == ["ARG", "FROM", "RUN", "CMD", "ENTRYPOINT"]
    assert steps[1].arguments == "base:${A}"
    assert steps[2].commands() == [["a", "x"], ["b", "y z"], ["c"]]
    assert steps[3].exec_form() == ["smoke", "--help"]
    assert steps[4].exec_form() is None


# --- Dockerfile.aarch64 -----------------------------------------------------------------------------


def test_parses_into_known_instructions_with_a_parametrised_base() -> None:
    steps = dockerfile()
    assert {step.keyword for step in steps} <= KNOWN
    keywords = [step.keyword for step in steps]
    first_from = keywords.index("FROM")
    args = dict(step.arguments.split("=", 1) for step in steps[:first_from] if step.keyword == "ARG")
    assert args == {"VLLM_IMAGE": "vllm/vllm-openai", "VLLM_TAG": "nightly-aarch64"}
    assert set(re.findall(r"\$\{(\w+)\}", one("FROM").arguments)) == set(args)
    assert one("FROM").arguments == "${VLLM_IMAGE}:${VLLM_TAG}"


def test_entrypoint_is_the_console_script_in_exec_form_run_from_the_source_dir() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    entrypoint = one("ENTRYPOINT").exec_form()
    assert entrypoint is not None and len(entrypoint) == 1
    assert entrypoint[0] in project["scripts"]
    command = one("CMD").exec_form()
    assert command is not None and command[0] == "smoke"
    # Relative suite paths (scenarios/smoke/...) and reports/ resolve in the copied source tree.
    assert one("WORKDIR").arguments == source_dir()


def test_copies_what_the_build_reads_and_the_shipped_suites() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    placed = {source: dest.rstrip("/") for sources, dest in copies() for source in sources}
    assert {"pyproject.toml", project["readme"], "itlaudit", "scenarios"} <= set(placed)
    assert all((ROOT / source).exists() for source in placed)
    base = source_dir()
    # Files land in the source directory; a directory's contents land in the destination it names.
    assert placed[project["readme"]] == base
    assert placed["itlaudit"] == f"{base}/itlaudit"
    assert placed["scenarios"] == f"{base}/scenarios"


def test_install_step_makes_a_venv_installs_this_repo_and_links_its_script() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (install,) = [step for step in dockerfile() if step.keyword == "RUN"]
    commands = install.commands()
    assert commands[0][:3] == ["python3", "-m", "venv"]
    venv = commands[0][3]
    pip = [c for c in commands if c[0] == f"{venv}/bin/pip"]
    assert len(pip) == 1 and pip[0][1] == "install" and pip[0][-1] == source_dir()
    assert "--no-cache-dir" in pip[0]
    (script,) = project["scripts"]
    assert ["ln", "-s", f"{venv}/bin/{script}", f"/usr/local/bin/{script}"] in commands
    # python3 must stay vLLM's interpreter: the itlaudit venv is never put first on PATH.
    assert not any(step.keyword == "ENV" and "PATH" in step.arguments for step in dockerfile())


def test_default_suite_exists_where_the_image_puts_it() -> None:
    from itlaudit.cli.smoke import DEFAULT_SUITE

    assert (ROOT / DEFAULT_SUITE / "suite.toml").is_file()
