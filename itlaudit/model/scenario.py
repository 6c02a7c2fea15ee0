"""Scenario files: the whole experiment (workload + the servers to compare) in one TOML file.

Validation happens here, up front, so a typo costs one line of error before any request is sent,
and every error names the file, the key and its line.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from itlaudit.errors import ScenarioError
from itlaudit.model.access import header_problem
from itlaudit.model.block import (
    BLOCK_METRICS,
    DEFAULT_BLOCK_PERCENTILES,
    GOODPUT_KEYS,
    BlockSettings,
    parse_goodput,
    parse_metric_percentiles,
    parse_percentile_metrics,
)
from itlaudit.model.datasets import DATASET_KINDS, DatasetEntry
from itlaudit.model.jsonvalue import JSONObject, JSONScalar
from itlaudit.model.launch import READY_TIMEOUT_S, LaunchKind, LaunchSpec, launch_kind_problem
from itlaudit.model.scenario_toml import (
    SEQUENCE_TOKENS,
    Bound,
    Located,
    dump_toml,
    get_number,
    get_table,
    get_value,
    reject_unknown_keys,
    str_list,
)
from itlaudit.model.serve_params import ServeValue, serve_settings
from itlaudit.model.tokenizer import tokenizer_file
from itlaudit.model.vocabulary import Endpoint, QualityGate
from itlaudit.model.workload import SECONDS, Workload, parse_workload

# Scenario and variant names become file and folder names (reports/<name>-<time>/, server-<variant>.log)
# and plot labels: no path separators, no leading dot, nothing matplotlib reads as markup (`$`).
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._+=@,-]{0,63}$")
# How a server executes its model: eagerly (--enforce-eager) or compiled (CUDA graphs / torch.compile,
# vLLM's default). The two paths round differently, so greedy near ties can flip between them.
EAGER = "eager"
COMPILED = "compiled"
EXECUTION_MODES = (EAGER, COMPILED)


@dataclass(frozen=True)
class Variant:
    name: str
    url: str | None = None
    launch: LaunchSpec | None = None
    # "eager" or "compiled"; for a server given by URL only the user knows (a launched one is read
    # from its arguments): lets a lossless mismatch at a near tie be judged (lossless.py).
    execution_mode: str | None = None
    # Extra HTTP headers for this variant's requests (over the command line's --header). Values are
    # sent, never written: meta.json and the ledger record the names only.
    headers: dict[str, str] = field(default_factory=dict)
    reset_prefix_cache: bool = False  # POST /reset_prefix_cache before the variant runs
    # The server's speculative configuration as the user knows it (vLLM's --speculative-config keys:
    # method, num_speculative_tokens, rejection_sample_method, synthetic_acceptance_length, ...), for a
    # server given by URL; a launched one's comes from its arguments (LaunchSpec.speculative_config).
    speculative_config: dict[str, Any] | None = None

    @property
    def speculation(self) -> dict[str, Any] | None:
        """What the variant's server speculates with, as far as anything here knows."""
        if self.speculative_config is not None:
            return self.speculative_config
        return self.launch.speculative_config if self.launch is not None else None


@dataclass(frozen=True)
class Scenario:
    name: str
    endpoint: Endpoint
    model: str
    workload: Workload
    variants: list[Variant]
    path: Path | None = None
    # [goodput]: per-request SLOs in ms (ttft_ms, tpot_ms, e2e_ms) that run's block (vllm bench's
    # request goodput) and `sweep` count goodput against.
    goodput: dict[str, float] = field(default_factory=dict)
    # The block's percentiles and the metrics they are given for (vllm bench's --metric-percentiles,
    # --percentile-metrics); summary.json keeps p50/p90/p99 whatever they say.
    metric_percentiles: tuple[float, ...] = DEFAULT_BLOCK_PERCENTILES
    percentile_metrics: tuple[str, ...] = BLOCK_METRICS
    # How output quality gates the figures (analysis.validity): against the baseline by default.
    quality_gate: QualityGate = QualityGate.RELATIVE
    # A local tokenizer.json (model.tokenizer) that counts a stream's tokens where the server sends
    # neither usage nor ids per chunk (vllm bench's --tokenizer); None: such a stream counts chunks.
    tokenizer: Path | None = None
    # The memory-bandwidth floor (analysis.roofline): the served model's config.json as read (its
    # bytes per decode step), the device's bandwidth where NVML's name is not in the table, or the
    # bytes per token outright; each None where not given.
    model_config: Mapping[str, Any] | None = None
    mem_bandwidth_gbps: float | None = None
    bytes_per_token: float | None = None
    # [sweep.serve]: server settings `sweep` runs one launched server each (model.serve_params);
    # run and compare measure the variants as they are.
    serve_params: dict[str, list[ServeValue]] = field(default_factory=dict)

    @property
    def block(self) -> BlockSettings:
        return BlockSettings(dict(self.goodput), self.metric_percentiles, self.percentile_metrics)

    @property
    def folder_name(self) -> str:
        """What its run folders are named after: the file's stem (two files that share a `name` still
        make folders one can tell apart), else the name."""
        return self.path.stem if self.path is not None else self.name

    def prompt_for(self, index: int) -> str:
        """Prompts cycle so num_requests may exceed the prompt list."""
        return self.workload.prompts[index % len(self.workload.prompts)]

    def entry_for(self, index: int) -> DatasetEntry | None:
        """The dataset line request `index` draws (cycling), or None for a plain prompt list."""
        dataset = self.workload.dataset
        return dataset.entries[index % len(dataset.entries)] if dataset is not None else None


def _table(raw: Mapping[str, object], key: str, loc: Located, fix: str) -> Mapping[str, object]:
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


# The key that makes a [variants.launch] table start a server, and the kind it starts it with (the
# first kind that needs it: `python` alone means vLLM's, not SGLang's, which also needs `python`).
_STARTED_BY: dict[str, LaunchKind] = {}
for _kind in LaunchKind:
    if _kind is not LaunchKind.URL:
        _STARTED_BY.setdefault(_kind.needs, _kind)


def _launch(src: Mapping[str, object], loc: Located, variant: str, provided: bool) -> LaunchSpec:
    table = "variants.launch"
    allowed = {"kind", "python", "image", "command", "model", "served_model_name", "server_args", "env"}
    allowed.add("ready_timeout_s")
    reject_unknown_keys(src, allowed, loc, table)
    if "kind" in src:
        kind = get_value(src, loc, table, "kind", str)
        problem = launch_kind_problem(kind)
        if problem is not None:
            raise loc.error(table, "kind", problem)
        needed = LaunchKind(kind).needs
        if needed not in src:
            raise loc.error(table, needed, f"is missing; kind {kind!r} needs it")
    else:
        kind = _kindless(src, loc, variant, provided)
    given = get_table(src, loc, table, "env", {})
    env = {name: value for name, value in given.items() if isinstance(value, str)}
    if len(env) != len(given):
        raise loc.error(table, "env", "values must be strings (quote numbers)")
    return LaunchSpec(
        kind=LaunchKind(kind),
        python=get_value(src, loc, table, "python", str, None),
        image=get_value(src, loc, table, "image", str, None),
        command=str_list(src, loc, table, "command"),
        model=get_value(src, loc, table, "model", str, None),
        served_model_name=get_value(src, loc, table, "served_model_name", str, None),
        server_args=str_list(src, loc, table, "server_args"),
        env=env,
        ready_timeout_s=float(
            get_number(src, loc, table, "ready_timeout_s", (int, float), SECONDS, READY_TIMEOUT_S)
        ),
    )


def _kindless(src: Mapping[str, object], loc: Located, variant: str, provided: bool) -> LaunchKind:
    """A [variants.launch] table without `kind` starts nothing: it holds the server arguments (and env,
    model, served_model_name, ready_timeout_s) for a server someone else supplies, which is what a
    bisect (or track nightly) provider does for every build it probes. Until the provider points it at
    a build it is LaunchKind.URL, as bisect's spec for a variant with no table is. Where nothing supplies
    the server (run, compare, sweep, smoke, the invariance audit) it is refused in one line, never
    started or dropped in silence; build_scenario drops it first where a flag gives the server."""
    starter = next((key for key in _STARTED_BY if key in src), None)
    if starter is not None:
        raise loc.error(
            "variants.launch", "kind", f"is missing; `{starter}` needs kind = {_STARTED_BY[starter].value!r}"
        )
    if not provided:
        raise loc.error(
            "variants",
            "launch",
            "has no `kind`: server arguments alone are for bisect and track nightly, whose --provider "
            'starts the server; to start it here give kind and its key (kind = "python" with python, '
            f'"docker" with image, "command" with command), or give variant {variant!r} a `url`',
        )
    return LaunchKind.URL


def _variants(raw: object, loc: Located, provided: bool) -> list[Variant]:
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
            src,
            {
                "name",
                "url",
                "launch",
                "execution_mode",
                "headers",
                "reset_prefix_cache",
                "speculative_config",
            },
            where,
            table,
        )
        name = _safe_name(get_value(src, where, table, "name", str), where, table)
        if any(v.name == name for v in out):
            raise where.error(table, "name", f"{name!r} is used twice; variant names must be unique")
        url = get_value(src, where, table, "url", str, None)
        if url is not None and not re.match(r"^https?://", url):
            raise where.error(table, "url", f"must start with http:// or https://, got {url!r}")
        if "launch" in src and not isinstance(src["launch"], dict):
            raise where.error(table, "launch", "must be a [variants.launch] table")
        launch = _launch(src["launch"], where, name, provided) if "launch" in src else None
        out.append(
            Variant(
                name=name,
                url=url.rstrip("/") if url else None,
                launch=launch,
                execution_mode=_execution_mode(src, where),
                headers=_headers(src, where),
                reset_prefix_cache=get_value(src, where, table, "reset_prefix_cache", bool, False),
                speculative_config=(
                    dict(get_table(src, where, table, "speculative_config"))
                    if "speculative_config" in src
                    else None
                ),
            )
        )
    return out


def _headers(src: Mapping[str, object], loc: Located) -> dict[str, str]:
    headers: dict[str, str] = {}
    for name, value in get_table(src, loc, "variants", "headers", {}).items():
        problem = header_problem(name, value)
        if problem is not None:
            raise loc.error("variants", "headers", f"{name!r}: {problem}")
        headers[name] = str(value)  # (a str: header_problem refuses any other value)
    return headers


def _execution_mode(src: Mapping[str, object], loc: Located) -> str | None:
    mode: str | None = get_value(src, loc, "variants", "execution_mode", str, None)
    if mode is not None and mode not in EXECUTION_MODES:
        raise loc.error(
            "variants", "execution_mode", f"must be one of {', '.join(EXECUTION_MODES)}, got {mode!r}"
        )
    return mode


# An SLO far above any run's length means "no limit" (vllm bench's auto_tune.sh passes e2el:1e11).
GOODPUT_MS = Bound(0, 1e15, open_low=True, unit="ms")


def _goodput(raw: Mapping[str, object], loc: Located) -> dict[str, float]:
    """[goodput]: a request counts toward goodput when it meets every limit given here."""
    if "goodput" not in raw:
        return {}
    src = _table(raw, "goodput", loc, "write a [goodput] table, e.g. tpot_ms = 20")
    reject_unknown_keys(src, set(GOODPUT_KEYS), loc, "goodput")
    limits = {}
    for key in src:
        limits[key] = float(get_number(src, loc, "goodput", key, (int, float), GOODPUT_MS))
    return limits


def _block_choice(raw: Mapping[str, object], loc: Located) -> tuple[tuple[float, ...], tuple[str, ...]]:
    """metric_percentiles = [90, 99] and percentile_metrics = ["ttft", "tpot"]: read as their flags are."""
    chosen = []
    for key, default, parse in (
        ("metric_percentiles", DEFAULT_BLOCK_PERCENTILES, parse_metric_percentiles),
        ("percentile_metrics", BLOCK_METRICS, parse_percentile_metrics),
    ):
        value = raw.get(key, default)
        if not isinstance(value, list | tuple) or not value:
            raise loc.error("", key, f"must be a non-empty list, got {value!r}")
        try:
            chosen.append(parse(",".join(str(v) for v in value)))
        except ScenarioError as exc:
            raise loc.error("", key, str(exc).partition(": ")[2]) from None
    return chosen[0], chosen[1]  # type: ignore[return-value]


def parse_scenario(text: str, path: Path, *, provided: bool = False) -> Scenario:
    """A scenario from its TOML text; relative paths in it resolve against `path`'s folder. `provided`:
    something else supplies every variant's server (bisect's --provider), so a [variants.launch] table
    may leave out `kind` and give only that server's arguments."""
    return scenario_from_raw(_toml(text, path), Located(path, text), path, provided=provided)


def scenario_from_raw(
    raw: Mapping[str, object], loc: Located, path: Path | None, *, provided: bool = False
) -> Scenario:
    """The one validation of a scenario's tables, whether they came from a file, from flags, or both.
    Relative paths resolve against the file's folder (the working directory when there is none)."""
    top_keys = {"name", "endpoint", "model", "workload", "variants", "description", "goodput", "quality_gate"}
    top_keys |= {"metric_percentiles", "percentile_metrics", "tokenizer", "sweep", *_ROOFLINE_KEYS}
    reject_unknown_keys(raw, top_keys, loc, "")
    name = get_value(raw, loc, "", "endpoint", str, Endpoint.COMPLETIONS)
    if name not in tuple(Endpoint):
        raise loc.error("", "endpoint", f"must be one of {', '.join(Endpoint)}, got {name!r}")
    endpoint = Endpoint(name)
    gate = get_value(raw, loc, "", "quality_gate", str, QualityGate.RELATIVE)
    if gate not in tuple(QualityGate):
        raise loc.error("", "quality_gate", f"must be one of {', '.join(QualityGate)}, got {gate!r}")
    if "workload" not in raw:
        raise loc.error("", "workload", "is missing; add a [workload] table with prompts and max_tokens")
    workload = _table(raw, "workload", loc, "write a [workload] table with prompts and max_tokens")
    base = path.parent if path is not None else Path.cwd()
    percentiles, metrics = _block_choice(raw, loc)
    tokenizer = get_value(raw, loc, "", "tokenizer", str, None)
    return Scenario(
        name=_safe_name(get_value(raw, loc, "", "name", str), loc, ""),
        endpoint=endpoint,
        model=get_value(raw, loc, "", "model", str, "auto"),
        workload=parse_workload(workload, loc, base, endpoint is Endpoint.CHAT),
        variants=_variants(raw.get("variants"), loc, provided),
        path=path,
        goodput=_goodput(raw, loc),
        quality_gate=QualityGate(gate),
        metric_percentiles=percentiles,
        percentile_metrics=metrics,
        tokenizer=None if tokenizer is None else _tokenizer(base / tokenizer, loc),
        serve_params=_serve_params(raw, loc),
        **_roofline(raw, loc, base),
    )


def _serve_params(raw: Mapping[str, object], loc: Located) -> dict[str, list[ServeValue]]:
    """[sweep.serve]: the server settings `sweep` grids (model.serve_params), NAME = [values]."""
    sweep = get_table(raw, loc, "", "sweep", {})
    reject_unknown_keys(sweep, {"serve"}, loc, "sweep")
    table = get_table(sweep, loc, "sweep", "serve", {})
    return serve_settings(table, f"{loc.path}: [sweep.serve]")


_ROOFLINE_KEYS = ("model_config", "mem_bandwidth_gbps", "bytes_per_token")
# A device's memory bandwidth in GB/s, and a step's bytes: from a phone's to a rack's, with room.
_GBPS = Bound(0, 1e6, open_low=True, unit="GB/s")
_BYTES = Bound(0, 1e15, open_low=True, unit="bytes")


def _roofline(raw: Mapping[str, object], loc: Located, base: Path) -> dict[str, Any]:
    """model_config = "PATH" (a config.json, or the model folder holding one), mem_bandwidth_gbps and
    bytes_per_token: the floor's inputs, read as their flags are."""
    found: dict[str, Any] = {}
    path = get_value(raw, loc, "", "model_config", str, None)
    if path is not None:
        found["model_config"] = _model_config(base / path, loc)
    for key, bounds in (("mem_bandwidth_gbps", _GBPS), ("bytes_per_token", _BYTES)):
        if key in raw:
            found[key] = float(get_number(raw, loc, "", key, (int, float), bounds))
    return found


def _model_config(path: Path, loc: Located) -> Mapping[str, Any]:
    found = path / "config.json" if path.is_dir() else path
    try:
        config = json.loads(found.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise loc.error("", "model_config", f"{found}: not a readable config.json ({exc})") from None
    if not isinstance(config, dict):
        raise loc.error("", "model_config", f"{found}: not a JSON object")
    return config


def _tokenizer(path: Path, loc: Located) -> Path:
    try:
        tokenizer_file(path)
    except ScenarioError as exc:
        raise loc.error("", "tokenizer", f"{path}: {str(exc).partition(': ')[2]}") from None
    return path


def _toml(text: str, path: Path) -> JSONObject:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{path}: not valid TOML: {exc}") from None


def _read(path: Path) -> str:
    if not path.is_file():
        raise ScenarioError(f"{path}: scenario file not found; pass a path to a .toml (see scenarios/)")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"{path}: cannot read scenario ({exc})") from None


def load_scenario(path: Path, *, provided: bool = False) -> Scenario:
    """The scenario in a file (`provided` as for parse_scenario)."""
    return parse_scenario(_read(path), path, provided=provided)


# A run from flags alone takes vllm bench serve's defaults, so the same flags mean the same workload.
_BENCH_DATASET: JSONObject = {"kind": "random", "input_len": 1024, "output_len": 128}
BENCH_DEFAULTS: JSONObject = {"dataset": _BENCH_DATASET, "num_requests": 1000}
# Each flag of ScenarioFlags and the key it sets: (table, key). One table, read by build_scenario to
# apply the flags and by scenario_toml to say which flag a written key stands for.
FLAG_KEYS: dict[str, tuple[str, str]] = {
    "model": ("", "model"),
    "endpoint": ("", "endpoint"),
    "quality_gate": ("", "quality_gate"),
    "tokenizer": ("", "tokenizer"),
    "model_config": ("", "model_config"),
    "mem_bandwidth_gbps": ("", "mem_bandwidth_gbps"),
    "bytes_per_token": ("", "bytes_per_token"),
    "dataset_name": ("workload.dataset", "kind"),
    "random_input_len": ("workload.dataset", "input_len"),
    "random_output_len": ("workload.dataset", "output_len"),
    "random_prefix_len": ("workload.dataset", "prefix_len"),
    "dataset_path": ("workload.dataset", "path"),
    "num_prompts": ("workload", "num_requests"),
    "max_concurrency": ("workload", "concurrency"),
    "request_rate": ("workload", "request_rate"),
    "burstiness": ("workload", "burstiness"),
    "num_warmups": ("workload", "warmup_requests"),
    "ignore_eos": ("workload", "ignore_eos"),
    "temperature": ("workload", "temperature"),
    "max_tokens": ("workload", "max_tokens"),
    "seed": ("workload", "seed"),
}
_DATASET_FLAGS = (
    "dataset_name",
    "random_input_len",
    "random_output_len",
    "random_prefix_len",
    "dataset_path",
)
_PATH_KEYS = (("workload", "prompts_file"), ("workload.dataset", "path"))


# Dataset kinds whose every request carries its own max_tokens (DatasetEntry.max_tokens).
_OWN_LENGTH_KINDS = ("trace", "prefix_repetition", "sharegpt", "multi_turn")


def _flag(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


@dataclass(frozen=True)
class ScenarioFlags:
    """A workload as `vllm bench serve` flags say it, and the servers as `--url`/`--variant` say them.
    None is "not given": the scenario's key stays. Each field sets the key FLAG_KEYS names."""

    model: str | None = None
    endpoint: str | None = None
    quality_gate: str | None = None
    dataset_name: str | None = None
    random_input_len: int | None = None
    random_output_len: int | None = None
    # vllm bench's --random-range-ratio: a random dataset's lengths drawn uniformly around their means
    random_range_ratio: str | None = None
    # vllm bench's --random-prefix-len: this many random tokens before every random prompt, shared
    random_prefix_len: int | None = None
    dataset_path: Path | None = None
    num_prompts: int | None = None
    max_concurrency: int | None = None
    request_rate: float | None = None  # inf: no rate (a closed loop), as vllm bench serve reads it
    burstiness: float | None = None
    num_warmups: int | None = None
    ignore_eos: bool | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    url: str | None = None  # every variant's server
    variant_urls: dict[str, str] = field(default_factory=dict)  # NAME=URL
    only: list[str] = field(default_factory=list)  # --only NAME: these variants, in this order
    # --extra-body JSON (vllm bench serve's): merged over the workload's extra_body, in every request
    extra_body: JSONObject = field(default_factory=dict)
    # What the block reports (model.block): --goodput, --metric-percentiles, --percentile-metrics
    goodput: str | None = None
    metric_percentiles: str | None = None
    percentile_metrics: str | None = None
    tokenizer: Path | None = None  # vllm bench's --tokenizer, a local folder or tokenizer.json
    model_config: Path | None = None  # the bandwidth floor's config.json (or its model folder)
    mem_bandwidth_gbps: float | None = None
    bytes_per_token: float | None = None

    def given(self) -> dict[str, JSONScalar]:
        """The workload flags that were given, by field name, as the values their keys take (a path
        as its text)."""
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name in FLAG_KEYS}
        return {
            name: str(value) if isinstance(value, Path) else value
            for name, value in values.items()
            if value is not None
        }

    def apply(self, raw: JSONObject) -> JSONObject:
        """The scenario's tables with every given flag over its key (a copy)."""
        raw = copy.deepcopy(raw)
        workload = raw.setdefault("workload", {})
        if not isinstance(workload, dict):
            return raw  # the parser names the problem
        given = self.given()
        if any(name in given for name in _DATASET_FLAGS):
            self._apply_dataset(workload, given)
        if "max_tokens" in given:
            self._max_tokens_reaches(workload, given)
        if self.random_range_ratio is not None:
            _range_lengths(workload, self.random_range_ratio)
        if self.goodput is not None:
            raw["goodput"] = dict(parse_goodput(self.goodput))
        if self.metric_percentiles is not None:
            raw["metric_percentiles"] = list(parse_metric_percentiles(self.metric_percentiles))
        if self.percentile_metrics is not None:
            raw["percentile_metrics"] = list(parse_percentile_metrics(self.percentile_metrics))
        if self.extra_body:
            kept = workload.get("extra_body")
            workload["extra_body"] = {**(kept if isinstance(kept, dict) else {}), **self.extra_body}
        for name, value in given.items():
            table, key = FLAG_KEYS[name]
            if table == "workload.dataset":
                continue
            target = raw if table == "" else workload
            if name == "request_rate" and isinstance(value, float) and math.isinf(value):
                target.pop(key, None)  # vllm bench serve's inf: every request at once, no schedule
                continue
            if name == "max_tokens" and isinstance(value, int) and "min_tokens" in workload:
                self._keep_min_tokens(workload, value)
            target[key] = value
        return raw

    @staticmethod
    def _max_tokens_reaches(workload: JSONObject, given: Mapping[str, JSONScalar]) -> None:
        """--max-tokens sets the workload's max_tokens, which a dataset that gives every request its own
        length overrides. A random dataset's output length is its requests' max_tokens (vllm bench's
        --random-output-len), so --max-tokens sets it, unless --random-output-len says another length;
        any other such dataset refuses it in one line, never ignores it in silence."""
        dataset = workload.get("dataset")
        kind = dataset.get("kind") if isinstance(dataset, dict) else None
        max_tokens = given["max_tokens"]
        if not isinstance(max_tokens, int) or SEQUENCE_TOKENS.problem(max_tokens):
            return  # the parser names the flag and its bound
        if isinstance(dataset, dict) and kind == "random":
            if given.get("random_output_len", max_tokens) != max_tokens:
                raise ScenarioError(
                    f"--max-tokens {max_tokens} and --random-output-len {given['random_output_len']} "
                    "disagree: a random request's max_tokens is its output length; give one of them"
                )
            dataset["output_len"] = max_tokens
        elif kind in _OWN_LENGTH_KINDS:
            raise ScenarioError(
                f"--max-tokens does not reach a {kind} dataset's requests: each takes its max_tokens from "
                "the dataset (its output_len or recorded reply); set the length there"
            )

    @staticmethod
    def _keep_min_tokens(workload: JSONObject, max_tokens: int) -> None:
        """A forced-length scenario (min_tokens = max_tokens) stays forced at the new length; a floor
        above the new cap is named with the flag, not as the file's mistake."""
        floor = workload["min_tokens"]
        if floor == workload.get("max_tokens"):
            workload["min_tokens"] = max_tokens
        elif isinstance(floor, int) and floor > max_tokens:
            raise ScenarioError(
                f"--max-tokens {max_tokens} is below the scenario's min_tokens ({floor}); raise it or "
                "edit min_tokens"
            )

    def _apply_dataset(self, workload: JSONObject, given: Mapping[str, JSONScalar]) -> None:
        old = workload.get("dataset")
        old = old if isinstance(old, dict) else {}
        kind = given.get("dataset_name", old.get("kind"))
        if kind is None:
            named = next(n for n in _DATASET_FLAGS if n in given)
            raise ScenarioError(f"{_flag(named)} needs --dataset-name (the scenario has no dataset)")
        dataset: JSONObject = {"kind": kind}
        if kind == "random":
            if "dataset_path" in given:
                raise ScenarioError("--dataset-path is for --dataset-name jsonl or sharegpt, not random")
            defaults = old if old.get("kind") == "random" else _BENCH_DATASET
            dataset |= {k: v for k, v in defaults.items() if k != "kind"}
            for name in ("random_input_len", "random_output_len", "random_prefix_len"):
                if name in given:
                    dataset[FLAG_KEYS[name][1]] = given[name]
        elif kind == "prefix_repetition":  # its lengths have no flags here: the scenario's table
            if old.get("kind") != kind or set(given) & set(_DATASET_FLAGS[1:]):
                raise ScenarioError(
                    "--dataset-name prefix_repetition takes its lengths from a scenario: [workload.dataset] "
                    "with prefix_len, suffix_len, num_prefixes and output_len (docs/scenarios.md)"
                )
            dataset = dict(old)
        else:
            for name in ("random_input_len", "random_output_len", "random_prefix_len"):
                if name in given:
                    raise ScenarioError(f"{_flag(name)} is for --dataset-name random, not {kind}")
            path = given.get("dataset_path")
            if path is None and "path" in old:
                dataset["path"] = old.get("path")
            elif path is None:
                raise ScenarioError(f"--dataset-name {kind} needs --dataset-path FILE")
            else:
                dataset["path"] = str(Path(str(path)).resolve())  # a flag's path is the shell's: the cwd
        workload.pop("prompts", None)
        workload.pop("prompts_file", None)
        workload["dataset"] = dataset


def _range_lengths(workload: JSONObject, text: str) -> None:
    """--random-range-ratio R (or vllm bench's JSON {"input": R, "output": R}): each random length L
    becomes { min = floor(L·(1−R)), max = ceil(L·(1+R)) }, drawn uniformly, as vllm bench draws it."""
    dataset = workload.get("dataset")
    if not isinstance(dataset, dict) or dataset.get("kind") != "random":
        raise ScenarioError("--random-range-ratio is for --dataset-name random")
    try:
        parsed = json.loads(text)
        ratios = (parsed["input"], parsed["output"]) if isinstance(parsed, dict) else (parsed, parsed)
        ratios = (float(ratios[0]), float(ratios[1]))
    except (ValueError, KeyError, TypeError):
        raise ScenarioError(
            f'--random-range-ratio {text!r}: give a number in [0, 1), or {{"input": R, "output": R}}'
        ) from None
    for ratio, key in zip(ratios, ("input_len", "output_len"), strict=True):
        if not 0 <= ratio < 1:
            raise ScenarioError(
                f"--random-range-ratio {text!r}: each ratio must be in [0, 1), as in vllm bench"
            )
        length = dataset.get(key)
        if ratio and isinstance(length, int):
            dataset[key] = {
                "min": max(1, math.floor(length * (1 - ratio))),
                "max": math.ceil(length * (1 + ratio)),
            }


def _flags_only_tables(flags: ScenarioFlags) -> JSONObject:
    """No scenario file: vllm bench serve's defaults, one variant per --variant, or `server` for --url."""
    servers = flags.variant_urls or ({"server": flags.url} if flags.url else {})
    if not servers:
        raise ScenarioError(
            "give a SCENARIO file, or a server: --url URL, or --variant NAME=URL (repeat for each)"
        )
    raw: JSONObject = {
        "name": "run",
        "endpoint": Endpoint.COMPLETIONS,
        "model": "auto",
        "workload": copy.deepcopy(BENCH_DEFAULTS),
        "variants": [{"name": name, "url": url} for name, url in servers.items()],
    }
    raw = flags.apply(raw)
    workload = raw["workload"]
    if isinstance(workload, dict):  # (it is: apply keeps the table built above)
        if "concurrency" not in workload and "request_rate" not in workload:
            # vllm bench serve with no --max-concurrency and no --request-rate sends every request at once
            workload["concurrency"] = workload.get("num_requests", 1)
        raw["name"] = _flags_name(workload)
    return raw


def _flags_name(workload: Mapping[str, object]) -> str:
    """A run from flags is named after its dataset, so `ls reports/` tells the workloads apart."""
    dataset = workload.get("dataset")
    if not isinstance(dataset, dict) or dataset.get("kind") not in DATASET_KINDS:
        return "run"
    if dataset["kind"] == "random":
        lengths = [dataset.get("input_len"), dataset.get("output_len")]
        if all(isinstance(n, int) for n in lengths):
            return f"random-{lengths[0]}-{lengths[1]}"
        return "random"
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(str(dataset.get("path"))).stem).strip("-.")[:40]
    return f"{dataset['kind']}-{stem}" if stem else str(dataset["kind"])


def build_scenario(path: Path | None, flags: ScenarioFlags) -> tuple[Scenario, JSONObject]:
    """The scenario a command runs: the file's tables (with no file, vllm bench serve's defaults and the
    flags' servers) with every given flag over its key, validated by the parser a file goes through.
    Also returns the merged tables with the flags' servers in them, for --save-scenario."""
    # A key a flag set is named by its flag: its value came from the command line, not the file.
    by_flag = {FLAG_KEYS[name]: _flag(name) for name in flags.given()}
    if path is None:
        raw = _flags_only_tables(flags)
        loc = Located(Path("command line"), "", by_flag)
    else:
        text = _read(path)
        raw = flags.apply(_toml(text, path))
        loc = Located(path, text, by_flag)
    scenario = scenario_from_raw(_unstarted_dropped(raw, flags), loc, path)
    known = [v.name for v in scenario.variants]
    unknown = [name for name in flags.variant_urls if name not in known]
    if unknown:
        raise ScenarioError(f"--variant names {', '.join(unknown)}, not in the scenario ({', '.join(known)})")
    for name in flags.only:
        if name not in known:
            raise ScenarioError(f"--only {name!r} is not in the scenario ({', '.join(known)})")
    if flags.only:
        by_name = {v.name: v for v in scenario.variants}
        scenario = replace(scenario, variants=[by_name[n] for n in dict.fromkeys(flags.only)])
    return scenario, _with_servers(raw, flags)


def _unstarted_dropped(raw: JSONObject, flags: ScenarioFlags) -> JSONObject:
    """The tables less each [variants.launch] without `kind` (server arguments for a server a bisect
    provider starts) that has nothing to do here: its variant gets its server from --url or --variant
    NAME=URL, or --only leaves it out. Any other is refused by the parser in one line (a copy)."""
    raw = copy.deepcopy(raw)
    variants = raw.get("variants")
    for variant in variants if isinstance(variants, list) else []:
        launch = variant.get("launch") if isinstance(variant, dict) else None
        if not isinstance(variant, dict) or not isinstance(launch, dict) or "kind" in launch:
            continue
        name = variant.get("name")
        served = flags.url is not None or (isinstance(name, str) and name in flags.variant_urls)
        if served or (flags.only and name not in flags.only):
            del variant["launch"]
    return raw


def _with_servers(raw: JSONObject, flags: ScenarioFlags) -> JSONObject:
    """The tables as run: a variant given a URL by flag is that server, not the one it would launch."""
    raw = copy.deepcopy(raw)
    variants = raw.get("variants")
    if flags.only and isinstance(variants, list):  # --only: the variants that run, in their order
        named = {v.get("name"): v for v in variants if isinstance(v, dict)}
        variants = raw["variants"] = [named[n] for n in dict.fromkeys(flags.only) if n in named]
    for variant in variants if isinstance(variants, list) else []:
        name = variant.get("name") if isinstance(variant, dict) else None
        url = flags.url or (flags.variant_urls.get(name) if isinstance(name, str) else None)
        if url and isinstance(variant, dict):
            variant["url"] = url
            variant.pop("launch", None)
    return raw


def scenario_toml(raw: JSONObject, base: Path, target: Path, header: list[str]) -> str:
    """`raw` (tables whose relative paths are relative to `base`) as the commented TOML of a file at
    `target`: each path rewritten so it still names the same file from there, each key a flag sets
    commented with that flag."""
    raw = copy.deepcopy(raw)
    for table, key in _PATH_KEYS:
        where = raw.get("workload")
        if table == "workload.dataset" and isinstance(where, dict):
            where = where.get("dataset")
        name = where.get(key) if isinstance(where, dict) else None
        if isinstance(where, dict) and isinstance(name, str):
            where[key] = _path_from(target.parent, Path(os.path.abspath(base / name)))
    notes = {(table, key): f"--{name.replace('_', '-')}" for name, (table, key) in FLAG_KEYS.items()}
    return dump_toml(raw, header, notes)


def _path_from(folder: Path, path: Path) -> str:
    """Relative when the file lies under the folder (the copy travels with it), else absolute."""
    try:
        return str(path.relative_to(os.path.abspath(folder)))
    except ValueError:
        return str(path)
