"""Dockerfile.aarch64 cannot be built here (no Docker engine, no aarch64 GPU): check what can be
checked statically, so an edit that breaks the recipe fails CI rather than a DGX Spark user."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile.aarch64"
KNOWN = {"ARG", "FROM", "COPY", "RUN", "WORKDIR", "ENTRYPOINT", "CMD", "ENV", "LABEL"}


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with comments dropped and `\\` continuations joined."""
    text = "\n".join(
        line for line in DOCKERFILE.read_text().splitlines() if not line.lstrip().startswith("#")
    )
    joined = re.sub(r"\\\n", " ", text)
    out = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word, " ".join(rest.split())))
    return out


def test_parses_into_known_instructions_with_a_parametrised_base() -> None:
    steps = _instructions()
    assert {word for word, _ in steps} <= KNOWN
    words = [word for word, _ in steps]
    first_from = words.index("FROM")
    args = dict(rest.split("=", 1) for word, rest in steps[:first_from] if word == "ARG")
    assert args == {"VLLM_IMAGE": "vllm/vllm-openai", "VLLM_TAG": "nightly-aarch64"}
    assert steps[first_from][1] == "${VLLM_IMAGE}:${VLLM_TAG}"
    assert words.count("FROM") == 1


def test_entrypoint_is_itlaudit_in_exec_form() -> None:
    steps = dict(_instructions())
    assert json.loads(steps["ENTRYPOINT"]) == ["itlaudit"]
    assert json.loads(steps["CMD"])[0] == "smoke"
    assert steps["WORKDIR"] == "/opt/itlaudit-src"


def test_install_step_builds_this_repo_and_copies_what_the_build_needs() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    steps = _instructions()
    copied = [rest for word, rest in steps if word == "COPY"]
    sources = {src for rest in copied for src in rest.split()[:-1]}
    # Everything pyproject's build reads: itself, the readme, the package; and the shipped suites.
    assert {"pyproject.toml", project["readme"], "itlaudit", "scenarios"} <= sources
    assert all((ROOT / src).exists() for src in sources)
    run = " ".join(rest for word, rest in steps if word == "RUN")
    assert "pip install --no-cache-dir /opt/itlaudit-src" in run
    # The console script the entrypoint runs is the one pyproject declares.
    assert "itlaudit" in project["scripts"]
    assert "/opt/itlaudit/bin/itlaudit /usr/local/bin/itlaudit" in run
    # python3 must stay vLLM's interpreter: the itlaudit venv is never put first on PATH.
    assert not any(word == "ENV" and "PATH" in rest for word, rest in steps)


def test_default_suite_exists_where_the_image_puts_it() -> None:
    from itlaudit.cli.smoke import DEFAULT_SUITE

    assert (ROOT / DEFAULT_SUITE / "suite.toml").is_file()
