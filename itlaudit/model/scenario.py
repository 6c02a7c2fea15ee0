"""Scenario files: the whole experiment (workload + the servers to compare) in one TOML file.

Validation happens here, up front, so a typo costs one line of error before any request is sent,
and every error names the file, the key and its line.
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from itlaudit.errors import ScenarioError
from itlaudit.model.access import valid_header
from itlaudit.model.datasets import Dataset, DatasetEntry, DatasetError, load_dataset
from itlaudit.model.launch_kinds import LAUNCH_KINDS
from itlaudit.model.records import RequestParams, Timeouts
from itlaudit.model.schedule import Arrivals, RampUp

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
class Workload:
    prompts: list[str]
    num_requests: int
    concurrency: int
    params: RequestParams
    extra_body: dict[str, Any] = field(default_factory=dict)
    timeouts: Timeouts = field(default_factory=Timeouts)
    arrivals: Arrivals = field(default_factory=Arrivals)
    dataset: Dataset | None = None  # [workload.dataset]: `prompts` then holds each entry's text


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


class _Located:
    """Finds the line of a key in the TOML text, so validation errors can point at it."""

    _header = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*$")

    def __init__(self, path: Path, text: str) -> None:
        self.path = path
        self.lines = text.splitlines()

    def line_of(self, table: str, key: str) -> int | None:
        current = ""
        key_re = re.compile(rf"^\s*{re.escape(key)}\s*=")
        for number, line in enumerate(self.lines, 1):
            header = self._header.match(line)
            if header:
                current = header.group(1)
                continue
            if current == table and key_re.match(line):
                return number
        return None

    def in_variant(self, index: int) -> _Located:
        """The same file, with `variants` keys looked up in the index-th [[variants]] table only, so an
        error in the second table points at the second table."""
        return _VariantLocated(self.path, self.lines, index)

    def error(self, table: str, key: str, problem: str) -> ScenarioError:
        where = f"{self.path}"
        line = self.line_of(table, key)
        if line is not None:
            where += f":{line}"
        dotted = f"{table}.{key}" if table else key
        return ScenarioError(f"{where}: `{dotted}` {problem}")


class _VariantLocated(_Located):
    """Line lookup confined to one [[variants]] table (and its [variants.launch])."""

    def __init__(self, path: Path, lines: list[str], index: int) -> None:
        self.path = path
        self.lines = lines
        self.index = index

    def line_of(self, table: str, key: str) -> int | None:
        starts = [n for n, line in enumerate(self.lines) if re.match(r"^\s*\[\[\s*variants\s*\]\]", line)]
        if self.index >= len(starts):
            return None  # inline `variants = [...]`: no table of its own
        end = starts[self.index + 1] if self.index + 1 < len(starts) else len(self.lines)
        region = _Located(self.path, "\n".join(self.lines[starts[self.index] : end]))
        found = region.line_of(table, key)
        if found is None and table == "variants":
            return starts[self.index] + 1  # a missing key: point at its table
        return starts[self.index] + found if found is not None else None


def _table(raw: dict[str, Any], key: str, loc: _Located, fix: str) -> dict[str, Any]:
    value = raw[key]
    if not isinstance(value, dict):
        raise loc.error("", key, f"must be a table, got {type(value).__name__} {value!r}; {fix}")
    return value


def _safe_name(value: str, loc: _Located, table: str, key: str = "name") -> str:
    if not _SAFE_NAME.match(value):
        shown = repr(value) if value else "empty"
        raise loc.error(
            table,
            key,
            f"is {shown}; a name is 1-64 letters, digits, spaces and ._+=@,- starting with a letter or "
            "digit (it becomes a file name and a plot label)",
        )
    return value


def _get(
    src: dict[str, Any],
    loc: _Located,
    table: str,
    key: str,
    kind: type | tuple[type, ...],
    default: Any = ...,
) -> Any:
    if key not in src:
        if default is ...:
            raise loc.error(table, key, "is missing; add it")
        return default
    value = src[key]
    # bool is an int subclass: a `true` where a number belongs is a mistake worth naming.
    wrong_bool = isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,))
    if wrong_bool or not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise loc.error(table, key, f"must be {names}, got {type(value).__name__} {value!r}")
    return value


def _positive(value: int, loc: _Located, table: str, key: str) -> int:
    if value < 1:
        raise loc.error(table, key, f"must be at least 1, got {value}")
    return value


def _int_list(src: dict[str, Any], loc: _Located, table: str, key: str) -> list[int]:
    values = _get(src, loc, table, key, list, [])
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise loc.error(table, key, "must be a list of integer token ids")
    return values


def _str_list(src: dict[str, Any], loc: _Located, table: str, key: str) -> list[str]:
    values = _get(src, loc, table, key, list, [])
    if not all(isinstance(v, str) for v in values):
        raise loc.error(table, key, "must be a list of strings")
    return values


def _unknown_keys(src: dict[str, Any], allowed: set[str], loc: _Located, table: str) -> None:
    for key in src:
        if key not in allowed:
            raise loc.error(table, key, f"is not a known key (known: {', '.join(sorted(allowed))})")


def _read_prompts_file(base: Path, name: str, loc: _Located) -> list[str]:
    """Plain text: prompts separated by a line holding only `---`, so multi-line prompts fit."""
    path = (base / name).resolve()
    if not path.is_file():
        raise loc.error("workload", "prompts_file", f"names {path}, which does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise loc.error(
            "workload", "prompts_file", f"names {path}, which is not UTF-8 text (byte {exc.start})"
        ) from None
    except OSError as exc:
        raise loc.error("workload", "prompts_file", f"names {path}, which cannot be read ({exc})") from None
    chunks = re.split(r"^---\s*$", text, flags=re.MULTILINE)
    prompts = [c.strip("\n") for c in chunks if c.strip()]
    if not prompts:
        raise loc.error("workload", "prompts_file", f"names {path}, which holds no prompt")
    return prompts


def _workload(src: dict[str, Any], loc: _Located, base: Path, chat: bool) -> Workload:
    table = "workload"
    allowed = {
        "prompts",
        "prompts_file",
        "num_requests",
        "concurrency",
        "max_tokens",
        "min_tokens",
        "ignore_eos",
        "temperature",
        "stop_token_ids",
        "seed",
        "extra_body",
        *TIMEOUT_KEYS,
        *ARRIVAL_KEYS,
        "dataset",
    }
    _unknown_keys(src, allowed, loc, table)
    if "dataset" in src and ("prompts" in src or "prompts_file" in src):
        raise loc.error(table, "dataset", "is used instead of `prompts`/`prompts_file`; keep one of them")
    if "prompts" in src and "prompts_file" in src:
        raise loc.error(table, "prompts_file", "cannot be given together with `prompts`; keep one")
    arrivals = _arrivals(src, loc, table)
    dataset = None
    if "dataset" in src:
        dataset = _dataset(src, loc, base, chat, arrivals)
        prompts = [entry.text() for entry in dataset.entries]
    elif "prompts_file" in src:
        prompts = _read_prompts_file(base, _get(src, loc, table, "prompts_file", str), loc)
    else:
        prompts = _str_list(src, loc, table, "prompts")
        if not prompts:
            raise loc.error(table, "prompts", "is missing or empty; give `prompts` or `prompts_file`")
    max_tokens = _get(src, loc, table, "max_tokens", int, None)
    min_tokens = _get(src, loc, table, "min_tokens", int, None)
    if max_tokens is not None:
        _positive(max_tokens, loc, table, "max_tokens")
    if min_tokens is not None and min_tokens < 0:
        raise loc.error(table, "min_tokens", f"must be at least 0, got {min_tokens}")
    if min_tokens is not None and max_tokens is not None and min_tokens > max_tokens:
        raise loc.error(table, "min_tokens", f"({min_tokens}) is larger than max_tokens ({max_tokens})")
    temperature = _get(src, loc, table, "temperature", (int, float), None)
    params = RequestParams(
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        ignore_eos=_get(src, loc, table, "ignore_eos", bool, False),
        stop_token_ids=_int_list(src, loc, table, "stop_token_ids"),
        temperature=float(temperature) if temperature is not None else None,
        seed=_get(src, loc, table, "seed", int, None),
    )
    num_requests = _positive(
        _get(src, loc, table, "num_requests", int, _default_count(src, arrivals, len(prompts), loc)),
        loc,
        table,
        "num_requests",
    )
    # With a rate, concurrency is only a cap; absent, nothing caps the open requests.
    uncapped = num_requests + arrivals.warmup_requests if arrivals.open_loop else 1
    return Workload(
        prompts=prompts,
        num_requests=num_requests,
        concurrency=_positive(_get(src, loc, table, "concurrency", int, uncapped), loc, table, "concurrency"),
        params=params,
        extra_body=_single_choice(_get(src, loc, table, "extra_body", dict, {}), loc, table),
        timeouts=_timeouts(src, loc, table),
        arrivals=arrivals,
        dataset=dataset,
    )


def _dataset(src: dict[str, Any], loc: _Located, base: Path, chat: bool, arrivals: Arrivals) -> Dataset:
    """[workload.dataset]; a random one draws as many requests as will be sent (num_requests, or what
    duration_s holds at the rate)."""
    table = "workload.dataset"
    raw = _get(src, loc, "workload", "dataset", dict)
    count = 0
    if raw.get("kind") == "random":
        if "num_requests" in src:
            count = _positive(
                _get(src, loc, "workload", "num_requests", int), loc, "workload", "num_requests"
            )
        elif arrivals.duration_s is not None and arrivals.mean_rate() is not None:
            count = _default_count(src, arrivals, 0, loc)
        else:
            raise loc.error(
                "workload", "num_requests", "is missing; a random dataset draws that many requests"
            )
    seed = _get(src, loc, "workload", "seed", int, None) or 0
    try:
        return load_dataset(raw, base, count, seed, chat)
    except DatasetError as exc:
        raise loc.error(table, exc.key, str(exc)) from None


ARRIVAL_KEYS = ("request_rate", "burstiness", "ramp_up", "duration_s", "warmup_requests")


def _positive_number(src: dict[str, Any], loc: _Located, table: str, key: str) -> float | None:
    value = _get(src, loc, table, key, (int, float), None)
    if value is not None and not value > 0:
        raise loc.error(table, key, f"must be a positive number, got {value!r}")
    return float(value) if value is not None else None


def _arrivals(src: dict[str, Any], loc: _Located, table: str) -> Arrivals:
    ramp = None
    if "ramp_up" in src:
        raw = _get(src, loc, table, "ramp_up", dict)
        _unknown_keys(raw, {"start_rate", "end_rate"}, loc, table)
        start = _positive_number(raw, loc, table, "start_rate")
        end = _positive_number(raw, loc, table, "end_rate")
        if start is None or end is None:
            raise loc.error(
                table, "ramp_up", "needs both rates: ramp_up = { start_rate = 1, end_rate = 8 } (requests/s)"
            )
        ramp = RampUp(start, end)
    burstiness = _positive_number(src, loc, table, "burstiness")
    warmup = _get(src, loc, table, "warmup_requests", int, 0)
    if warmup < 0:
        raise loc.error(table, "warmup_requests", f"must be 0 or more, got {warmup}")
    arrivals = Arrivals(
        request_rate=_positive_number(src, loc, table, "request_rate"),
        burstiness=burstiness if burstiness is not None else 1.0,
        ramp_up=ramp,
        duration_s=_positive_number(src, loc, table, "duration_s"),
        warmup_requests=warmup,
    )
    if burstiness is not None and not arrivals.open_loop:
        raise loc.error(table, "burstiness", "shapes open-loop arrivals: set `request_rate` too")
    return arrivals


def _default_count(src: dict[str, Any], arrivals: Arrivals, prompts: int, loc: _Located) -> int:
    """num_requests when left out: enough arrivals to fill duration_s at the rate, else one per prompt."""
    rate = arrivals.mean_rate()
    if arrivals.duration_s is None:
        return prompts
    if rate is None:
        raise loc.error(
            "workload",
            "duration_s",
            "needs `num_requests` in a closed loop (the most to send before the time is up), or a "
            "`request_rate`",
        )
    return max(1, math.ceil(rate * arrivals.duration_s))


TIMEOUT_KEYS = ("connect_timeout_s", "ttft_timeout_s", "stall_timeout_s", "request_timeout_s")


def _timeouts(src: dict[str, Any], loc: _Located, table: str) -> Timeouts:
    """Each key overrides its default; 0 is refused (it would cut every request), and a limit is
    switched off by leaving it out where its default is none, or by a very large number."""
    defaults = Timeouts()
    values: dict[str, float | None] = {}
    for key in TIMEOUT_KEYS:
        value = _get(src, loc, table, key, (int, float), defaults.limit(key))
        if value is not None and value <= 0:
            raise loc.error(table, key, f"must be a positive number of seconds, not {value}")
        values[key] = float(value) if value is not None else None
    return Timeouts(**values)


def _single_choice(extra_body: dict[str, Any], loc: _Located, table: str) -> dict[str, Any]:
    """Records hold one choice per request: n > 1 (or best_of) would interleave several texts into
    one stream, so it is refused here rather than measured wrongly."""
    for key in ("n", "best_of"):
        value = extra_body.get(key, 1)
        if value != 1:
            raise loc.error(
                table,
                "extra_body",
                f"sets {key} = {value!r}; itlaudit records one choice per request, so use n = 1 and "
                "raise num_requests instead",
            )
    return extra_body


def _launch(src: dict[str, Any], loc: _Located) -> LaunchConfig:
    table = "variants.launch"
    allowed = {"kind", "python", "image", "command", "model", "served_model_name", "server_args", "env"}
    allowed.add("ready_timeout_s")
    _unknown_keys(src, allowed, loc, table)
    kind = _get(src, loc, table, "kind", str)
    if kind not in LAUNCH_KINDS:
        raise loc.error(table, "kind", f"must be one of {', '.join(LAUNCH_KINDS)}, got {kind!r}")
    needed = LAUNCH_KINDS[kind]
    if needed is not None and needed not in src:
        raise loc.error(table, needed, f"is missing; kind {kind!r} needs it")
    env = _get(src, loc, table, "env", dict, {})
    if not all(isinstance(v, str) for v in env.values()):
        raise loc.error(table, "env", "values must be strings (quote numbers)")
    return LaunchConfig(
        kind=kind,
        python=_get(src, loc, table, "python", str, None),
        image=_get(src, loc, table, "image", str, None),
        command=_str_list(src, loc, table, "command"),
        model=_get(src, loc, table, "model", str, None),
        served_model_name=_get(src, loc, table, "served_model_name", str, None),
        server_args=_str_list(src, loc, table, "server_args"),
        env=env,
        ready_timeout_s=float(_get(src, loc, table, "ready_timeout_s", (int, float), 300.0)),
    )


def _variants(raw: Any, loc: _Located) -> list[Variant]:
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
        _unknown_keys(
            src, {"name", "url", "launch", "execution_mode", "headers", "reset_prefix_cache"}, where, table
        )
        name = _safe_name(_get(src, where, table, "name", str), where, table)
        if any(v.name == name for v in out):
            raise where.error(table, "name", f"{name!r} is used twice; variant names must be unique")
        url = _get(src, where, table, "url", str, None)
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
                reset_prefix_cache=_get(src, where, table, "reset_prefix_cache", bool, False),
            )
        )
    return out


def _headers(src: dict[str, Any], loc: _Located) -> dict[str, str]:
    headers = _get(src, loc, "variants", "headers", dict, {})
    if not all(valid_header(name, value) for name, value in headers.items()):
        raise loc.error(
            "variants", "headers", 'must map header names to one-line strings: headers = { "X-Team" = "a" }'
        )
    return headers


def _execution_mode(src: dict[str, Any], loc: _Located) -> str | None:
    mode = _get(src, loc, "variants", "execution_mode", str, None)
    if mode is not None and mode not in EXECUTION_MODES:
        raise loc.error(
            "variants", "execution_mode", f"must be one of {', '.join(EXECUTION_MODES)}, got {mode!r}"
        )
    return mode


GOODPUT_KEYS = ("ttft_ms", "tpot_ms", "e2e_ms")


def _goodput(raw: dict[str, Any], loc: _Located) -> dict[str, float]:
    """[goodput]: a request counts toward goodput when it meets every limit given here."""
    if "goodput" not in raw:
        return {}
    src = _table(raw, "goodput", loc, "write a [goodput] table, e.g. tpot_ms = 20")
    _unknown_keys(src, set(GOODPUT_KEYS), loc, "goodput")
    limits = {}
    for key in src:
        value = _get(src, loc, "goodput", key, (int, float))
        if not value > 0:
            raise loc.error("goodput", key, f"must be a positive number of milliseconds, not {value}")
        limits[key] = float(value)
    return limits


def parse_scenario(text: str, path: Path) -> Scenario:
    loc = _Located(path, text)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{path}: not valid TOML: {exc}") from None
    top_keys = {"name", "endpoint", "model", "workload", "variants", "description", "goodput"}
    _unknown_keys(raw, top_keys, loc, "")
    endpoint = _get(raw, loc, "", "endpoint", str, "completions")
    if endpoint not in ENDPOINTS:
        raise loc.error("", "endpoint", f"must be one of {', '.join(ENDPOINTS)}, got {endpoint!r}")
    if "workload" not in raw:
        raise loc.error("", "workload", "is missing; add a [workload] table with prompts and max_tokens")
    workload = _table(raw, "workload", loc, "write a [workload] table with prompts and max_tokens")
    return Scenario(
        name=_safe_name(_get(raw, loc, "", "name", str), loc, ""),
        endpoint=endpoint,
        model=_get(raw, loc, "", "model", str, "auto"),
        workload=_workload(workload, loc, path.parent, endpoint == "chat"),
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
