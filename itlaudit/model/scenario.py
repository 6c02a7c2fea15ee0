"""Scenario files: the whole experiment (workload + the servers to compare) in one TOML file.

Validation happens here, up front, so a typo costs one line of error before any request is sent,
and every error names the file, the key and its line.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from itlaudit.errors import ScenarioError
from itlaudit.model.access import valid_header
from itlaudit.model.datasets import DatasetEntry
from itlaudit.model.launch_kinds import STARTED_KINDS, launch_kind_problem
from itlaudit.model.scenario_toml import Located, get_value, reject_unknown_keys, str_list
from itlaudit.model.workload import Workload, parse_workload

__all__ = [
    "COMPILED",
    "EAGER",
    "ENDPOINTS",
    "EXECUTION_MODES",
    "GOODPUT_KEYS",
    "LaunchConfig",
    "Scenario",
    "Variant",
    "load_scenario",
    "parse_scenario",
]

ENDPOINTS = ("completions", "chat")
# Scenario and variant names become file and folder names (reports/<name>-<time>/, server-<variant>.log)
# and plot labels: no path separators, no leading dot, nothing matplotlib reads as markup (`$`).
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._+=@,-]{0,63}$")
# How a server executes its model: eagerly (--enforce-eager) or compiled (CUDA graphs / torch.compile,
# vLLM's default). The two paths round differently, so greedy near ties can flip between them.
EAGER = "eager"
COMPILED = "compiled"
EXECUTION_MODES = (EAGER, COMPILED)


@dataclass(frozen=True)
class LaunchConfig:
    """How to start the server for one variant (consumed by the launcher)."""

    kind: str
    python: str | None = None
    image: str | None = None
    command: list[str] = field(default_factory=list)
    model: str | None = None
    served_model_name: str | None = None
    server_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    ready_timeout_s: float = 300.0


@dataclass(frozen=True)
class Variant:
    name: str
    url: str | None = None
    launch: LaunchConfig | None = None
    # "eager" or "compiled"; for a server given by URL only the user knows (a launched one is read
    # from its arguments): lets a lossless mismatch at a near tie be judged (lossless.py).
    execution_mode: str | None = None
    # Extra HTTP headers for this variant's requests (over the command line's --header). Values are
    # sent, never written: meta.json and the ledger record the names only.
    headers: dict[str, str] = field(default_factory=dict)
    reset_prefix_cache: bool = False  # POST /reset_prefix_cache before the variant runs


@dataclass(frozen=True)
class Scenario:
    name: str
    endpoint: str
    model: str
    workload: Workload
    variants: list[Variant]
    path: Path | None = None
    # [goodput]: per-request SLOs in ms (ttft_ms, tpot_ms, e2e_ms) that `sweep` counts goodput against.
    goodput: dict[str, float] = field(default_factory=dict)

    def prompt_for(self, index: int) -> str:
        """Prompts cycle so num_requests may exceed the prompt list."""
        return self.workload.prompts[index % len(self.workload.prompts)]

    def entry_for(self, index: int) -> DatasetEntry | None:
        """The dataset line request `index` draws (cycling), or None for a plain prompt list."""
        dataset = self.workload.dataset
        return dataset.entries[index % len(dataset.entries)] if dataset is not None else None


def _table(raw: dict[str, Any], key: str, loc: Located, fix: str) -> dict[str, Any]:
    value = raw[key]
    if not isinstance(value, dict):
        raise loc.error("", key, f"must be a table, got {type(value).__name__} {value!r}; {fix}")
    return value


def _safe_name(value: str, loc: Located, table: str, key: str = "name") -> str:
    if not _SAFE_NAME.match(value):
        shown = repr(value) if value else "empty"
        raise loc.error(
            table,
            key,
            f"is {shown}; a name is 1-64 letters, digits, spaces and ._+=@,- starting with a letter or "
            "digit (it becomes a file name and a plot label)",
        )
    return value


def _launch(src: dict[str, Any], loc: Located) -> LaunchConfig:
    table = "variants.launch"
    allowed = {"kind", "python", "image", "command", "model", "served_model_name", "server_args", "env"}
    allowed.add("ready_timeout_s")
    reject_unknown_keys(src, allowed, loc, table)
    kind = get_value(src, loc, table, "kind", str)
    problem = launch_kind_problem(kind)
    if problem is not None:
        raise loc.error(table, "kind", problem)
    needed = STARTED_KINDS[kind]
    if needed not in src:
        raise loc.error(table, needed, f"is missing; kind {kind!r} needs it")
    env = get_value(src, loc, table, "env", dict, {})
    if not all(isinstance(v, str) for v in env.values()):
        raise loc.error(table, "env", "values must be strings (quote numbers)")
    return LaunchConfig(
        kind=kind,
        python=get_value(src, loc, table, "python", str, None),
        image=get_value(src, loc, table, "image", str, None),
        command=str_list(src, loc, table, "command"),
        model=get_value(src, loc, table, "model", str, None),
        served_model_name=get_value(src, loc, table, "served_model_name", str, None),
        server_args=str_list(src, loc, table, "server_args"),
        env=env,
        ready_timeout_s=float(get_value(src, loc, table, "ready_timeout_s", (int, float), 300.0)),
    )


def _variants(raw: Any, loc: Located) -> list[Variant]:
    if raw is not None and not isinstance(raw, list):
        raise loc.error("", "variants", f"must be [[variants]] tables, got {type(raw).__name__} {raw!r}")
    if not raw:
        raise loc.error("", "variants", "is missing; add at least one [[variants]] table with `name`")
    out: list[Variant] = []
    for index, src in enumerate(raw):
        table = "variants"
        if not isinstance(src, dict):
            raise loc.error(
                "",
                "variants",
                f"entry {index + 1} is {src!r}; each variant is a [[variants]] table with `name`",
            )
        where = loc.in_variant(index)
        reject_unknown_keys(
            src, {"name", "url", "launch", "execution_mode", "headers", "reset_prefix_cache"}, where, table
        )
        name = _safe_name(get_value(src, where, table, "name", str), where, table)
        if any(v.name == name for v in out):
            raise where.error(table, "name", f"{name!r} is used twice; variant names must be unique")
        url = get_value(src, where, table, "url", str, None)
        if url is not None and not re.match(r"^https?://", url):
            raise where.error(table, "url", f"must start with http:// or https://, got {url!r}")
        if "launch" in src and not isinstance(src["launch"], dict):
            raise where.error(table, "launch", "must be a [variants.launch] table")
        launch = _launch(src["launch"], where) if "launch" in src else None
        out.append(
            Variant(
                name=name,
                url=url.rstrip("/") if url else None,
                launch=launch,
                execution_mode=_execution_mode(src, where),
                headers=_headers(src, where),
                reset_prefix_cache=get_value(src, where, table, "reset_prefix_cache", bool, False),
            )
        )
    return out


def _headers(src: dict[str, Any], loc: Located) -> dict[str, str]:
    headers = get_value(src, loc, "variants", "headers", dict, {})
    if not all(valid_header(name, value) for name, value in headers.items()):
        raise loc.error(
            "variants", "headers", 'must map header names to one-line strings: headers = { "X-Team" = "a" }'
        )
    return headers


def _execution_mode(src: dict[str, Any], loc: Located) -> str | None:
    mode = get_value(src, loc, "variants", "execution_mode", str, None)
    if mode is not None and mode not in EXECUTION_MODES:
        raise loc.error(
            "variants", "execution_mode", f"must be one of {', '.join(EXECUTION_MODES)}, got {mode!r}"
        )
    return mode


GOODPUT_KEYS = ("ttft_ms", "tpot_ms", "e2e_ms")


def _goodput(raw: dict[str, Any], loc: Located) -> dict[str, float]:
    """[goodput]: a request counts toward goodput when it meets every limit given here."""
    if "goodput" not in raw:
        return {}
    src = _table(raw, "goodput", loc, "write a [goodput] table, e.g. tpot_ms = 20")
    reject_unknown_keys(src, set(GOODPUT_KEYS), loc, "goodput")
    limits = {}
    for key in src:
        value = get_value(src, loc, "goodput", key, (int, float))
        if not value > 0:
            raise loc.error("goodput", key, f"must be a positive number of milliseconds, not {value}")
        limits[key] = float(value)
    return limits


def parse_scenario(text: str, path: Path) -> Scenario:
    loc = Located(path, text)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{path}: not valid TOML: {exc}") from None
    top_keys = {"name", "endpoint", "model", "workload", "variants", "description", "goodput"}
    reject_unknown_keys(raw, top_keys, loc, "")
    endpoint = get_value(raw, loc, "", "endpoint", str, "completions")
    if endpoint not in ENDPOINTS:
        raise loc.error("", "endpoint", f"must be one of {', '.join(ENDPOINTS)}, got {endpoint!r}")
    if "workload" not in raw:
        raise loc.error("", "workload", "is missing; add a [workload] table with prompts and max_tokens")
    workload = _table(raw, "workload", loc, "write a [workload] table with prompts and max_tokens")
    return Scenario(
        name=_safe_name(get_value(raw, loc, "", "name", str), loc, ""),
        endpoint=endpoint,
        model=get_value(raw, loc, "", "model", str, "auto"),
        workload=parse_workload(workload, loc, path.parent, endpoint == "chat"),
        variants=_variants(raw.get("variants"), loc),
        path=path,
        goodput=_goodput(raw, loc),
    )


def load_scenario(path: Path) -> Scenario:
    if not path.is_file():
        raise ScenarioError(f"{path}: scenario file not found; pass a path to a .toml (see scenarios/)")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"{path}: cannot read scenario ({exc})") from None
    return parse_scenario(text, path)
