"""The [workload] table: prompts (list, file or dataset), request parameters, arrivals and timeouts."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from itlaudit.errors import DatasetError
from itlaudit.model.datasets import Dataset, load_dataset
from itlaudit.model.jsonvalue import JSONObject, JSONValue
from itlaudit.model.records import RequestParams, Timeouts
from itlaudit.model.scenario_toml import (
    SEQUENCE_TOKENS,
    Bound,
    Located,
    check_bound,
    get_number,
    get_table,
    get_value,
    int_list,
    reject_unknown_keys,
    str_list,
)
from itlaudit.model.schedule import DURATION_GRACE_S, LONGEST_SCHEDULE_S, Arrivals, RampUp, expected_span_s

# The range of every numeric [workload] key (docs/scenarios.md "Bounds" lists them). The ceilings are
# far above any real benchmark and low enough that what they let through is built in seconds.
MAX_REQUESTS = 1_000_000  # each planned request holds its encoded body in memory before the run
REQUESTS = Bound(1, MAX_REQUESTS, integer=True)
SECONDS = Bound(0, LONGEST_SCHEDULE_S, open_low=True, unit="s")  # 0 would cut every request at once
RATE = Bound(0, 1_000_000, open_low=True, unit="requests/s")
BOUNDS: dict[str, Bound] = {
    "num_requests": REQUESTS,
    "concurrency": REQUESTS,
    "warmup_requests": Bound(0, MAX_REQUESTS, integer=True),
    "max_tokens": SEQUENCE_TOKENS,
    "min_tokens": Bound(0, SEQUENCE_TOKENS.hi, integer=True),
    "temperature": Bound(0, 100),  # vLLM takes any temperature >= 0; above ~2 the text is noise already
    # numpy's generators take no negative seed; engines keep it in an int64
    "seed": Bound(0, 2**63 - 1, integer=True),
    "request_rate": RATE,
    "start_rate": RATE,
    "end_rate": RATE,
    # A gamma shape: coefficient of variation 1/sqrt(B) from 10 to 0.03; `inf` (fixed intervals) is
    # the one non-finite value taken, as the schedule's documented special case.
    "burstiness": Bound(0.01, 1000),
    "duration_s": SECONDS,
    "duration_grace_s": Bound(0, LONGEST_SCHEDULE_S, unit="s"),  # 0: cut open streams at duration_s
    "connect_timeout_s": SECONDS,
    "ttft_timeout_s": SECONDS,
    "stall_timeout_s": SECONDS,
    "request_timeout_s": SECONDS,
    # A trace's intervals times this: 0.001 replays a day's trace in ~90 s, 1000 slows a burst down.
    "trace_scale": Bound(0.001, 1000),
}
# The sampling keys `extra_body` may set that the server would otherwise take as they come: the same
# ranges as the workload's own keys, and vLLM's for the rest.
EXTRA_BODY_BOUNDS: dict[str, Bound] = {
    **{key: BOUNDS[key] for key in ("max_tokens", "min_tokens", "temperature", "seed")},
    "top_p": Bound(0, 1, open_low=True),
    "top_k": Bound(-1, SEQUENCE_TOKENS.hi, integer=True),  # -1 (or 0): no top-k
    "min_p": Bound(0, 1),
    "presence_penalty": Bound(-2, 2),
    "frequency_penalty": Bound(-2, 2),
    "repetition_penalty": Bound(0, 100, open_low=True),
}


@dataclass(frozen=True)
class Workload:
    prompts: list[str]
    num_requests: int
    concurrency: int
    params: RequestParams
    extra_body: JSONObject = field(default_factory=dict)  # sent as it is in every request
    timeouts: Timeouts = field(default_factory=Timeouts)
    arrivals: Arrivals = field(default_factory=Arrivals)
    dataset: Dataset | None = None  # [workload.dataset]: `prompts` then holds each entry's text


def _read_prompts_file(base: Path, name: str, loc: Located) -> list[str]:
    """Plain text: prompts separated by a line holding only `---`, so multi-line prompts fit."""
    path = (base / name).resolve()
    if not path.is_file():
        where = "" if Path(name).is_absolute() else f" (read from the scenario's folder, {base})"
        raise loc.error("workload", "prompts_file", f"names {path}, which does not exist{where}")
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


def parse_workload(src: Mapping[str, object], loc: Located, base: Path, chat: bool) -> Workload:
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
    reject_unknown_keys(src, allowed, loc, table)
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
        prompts = _read_prompts_file(base, get_value(src, loc, table, "prompts_file", str), loc)
    else:
        prompts = str_list(src, loc, table, "prompts")
        if not prompts:
            raise loc.error(table, "prompts", "is missing or empty; give `prompts` or `prompts_file`")
    arrivals = _dataset_arrivals(src, loc, arrivals, dataset)
    max_tokens = get_number(src, loc, table, "max_tokens", int, BOUNDS["max_tokens"], None)
    min_tokens = get_number(src, loc, table, "min_tokens", int, BOUNDS["min_tokens"], None)
    if min_tokens is not None and max_tokens is not None and min_tokens > max_tokens:
        raise loc.error(table, "min_tokens", f"({min_tokens}) is larger than max_tokens ({max_tokens})")
    temperature = get_number(src, loc, table, "temperature", (int, float), BOUNDS["temperature"], None)
    params = RequestParams(
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        ignore_eos=get_value(src, loc, table, "ignore_eos", bool, False),
        stop_token_ids=int_list(src, loc, table, "stop_token_ids"),
        temperature=float(temperature) if temperature is not None else None,
        seed=_seed(src, loc),
    )
    num_requests = _num_requests(src, loc, _default_count(src, arrivals, len(prompts), loc))
    if arrivals.trace_s is not None:
        # A trace is replayed once, each phase from its start: more requests than lines stop at its
        # end, as vLLM's timed_trace reader does (vllm bench's default --num-prompts is 1000).
        num_requests = min(num_requests, len(arrivals.trace_s))
        if arrivals.warmup_requests > len(arrivals.trace_s):
            raise loc.error(
                table,
                "warmup_requests",
                f"({arrivals.warmup_requests}) is more than the trace's {len(arrivals.trace_s)} lines: "
                "the warmup replays the trace's start once; send fewer",
            )
    _check_span(arrivals, num_requests, loc, table)
    # With a rate, concurrency is only a cap; absent, nothing caps the open requests.
    uncapped = num_requests + arrivals.warmup_requests if arrivals.open_loop else 1
    # msgspec's builtins: a TOML date or time becomes the ISO string msgspec would send for it.
    extra_body: JSONObject = msgspec.to_builtins(get_table(src, loc, table, "extra_body", {}))
    _check_extra_body(extra_body, loc, table)
    return Workload(
        prompts=prompts,
        num_requests=num_requests,
        concurrency=get_number(src, loc, table, "concurrency", int, BOUNDS["concurrency"], uncapped),
        params=params,
        extra_body=_single_choice(extra_body, loc, table),
        timeouts=_timeouts(src, loc, table),
        arrivals=arrivals,
        dataset=dataset,
    )


def _seed(src: Mapping[str, object], loc: Located) -> int | None:
    seed: int | None = get_number(src, loc, "workload", "seed", int, BOUNDS["seed"], None)
    return seed


def _num_requests(src: Mapping[str, object], loc: Located, default: int) -> int:
    """num_requests as given, else `default` (which the arrivals or the prompts set), within bounds
    either way: a default can be as absurd as the rate and duration it came from."""
    value: int = get_value(src, loc, "workload", "num_requests", int, default)
    check_bound(value, BOUNDS["num_requests"], loc, "workload", "num_requests")
    return value


def _check_span(arrivals: Arrivals, num_requests: int, loc: Located, table: str) -> None:
    """An open loop whose schedule would send nothing within duration_s, or whose warmup and measured
    phases would take more than a day, is a rate typed wrong (1e-9 for 1e9): refused with the span,
    not left to sit idle for years."""
    rate = arrivals.mean_rate()
    if rate is None:
        return
    key = "ramp_up" if arrivals.ramp_up is not None else "request_rate"
    if arrivals.trace_s is not None:
        key = "trace_scale"
    first = expected_span_s(1, arrivals)
    if arrivals.duration_s is not None and first > arrivals.duration_s:
        raise loc.error(
            table,
            key,
            f"at {rate:g} requests/s sends its first request after ~{first:.3g} s, past duration_s "
            f"({arrivals.duration_s:g} s): nothing would be measured; raise the rate or the duration",
        )
    measured = expected_span_s(num_requests, arrivals)
    if arrivals.duration_s is not None:  # the measured phase stops sending at duration_s
        measured = min(measured, arrivals.duration_s)
    span = expected_span_s(arrivals.warmup_requests, arrivals) + measured  # warmup comes first
    if span > LONGEST_SCHEDULE_S:
        raise loc.error(
            table,
            key,
            f"at {rate:g} requests/s spreads {arrivals.warmup_requests + num_requests} requests over "
            f"~{span:.3g} s, more than a day ({LONGEST_SCHEDULE_S:g} s); raise the rate, send fewer "
            "requests, or set duration_s",
        )


def _check_extra_body(extra_body: JSONObject, loc: Located, table: str) -> None:
    """extra_body goes into every request as it is: a nan or inf in it would reach the server as JSON
    it cannot parse, or a sampling value it would take without a word."""
    for key, value in extra_body.items():
        bound = EXTRA_BODY_BOUNDS.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            if _non_finite(value):
                raise loc.error(
                    table, "extra_body", f"holds a nan or inf under {key!r}; give a finite number"
                )
            continue
        problem = bound.problem(value) if bound is not None else None
        if problem is None and not math.isfinite(value):
            problem = f"must be a finite number, got {value!r}"
        if problem is not None:
            raise loc.error(table, "extra_body", f"sets {key}: {problem}")


def _non_finite(value: JSONValue) -> bool:
    """A nan or inf anywhere inside a nested value."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_non_finite(v) for v in value.values())
    if isinstance(value, list):
        return any(_non_finite(v) for v in value)
    return False


def _dataset(src: Mapping[str, object], loc: Located, base: Path, chat: bool, arrivals: Arrivals) -> Dataset:
    """[workload.dataset]; a random one draws as many requests as will be sent (num_requests, or what
    duration_s holds at the rate)."""
    table = "workload.dataset"
    raw = get_table(src, loc, "workload", "dataset")
    count = 0
    if raw.get("kind") in ("random", "prefix_repetition"):
        if "num_requests" in src:
            count = _num_requests(src, loc, 0)
        elif arrivals.duration_s is not None and arrivals.mean_rate() is not None:
            count = _num_requests(src, loc, _default_count(src, arrivals, 0, loc))
        else:
            raise loc.error(
                "workload", "num_requests", f"is missing; a {raw['kind']} dataset draws that many requests"
            )
        _check_span(arrivals, count, loc, "workload")  # before drawing that many prompts
    seed = _seed(src, loc) or 0
    try:
        return load_dataset(raw, base, count, seed, chat)
    except DatasetError as exc:
        raise loc.error(table, exc.key, str(exc)) from None


ARRIVAL_KEYS = (
    "request_rate",
    "burstiness",
    "ramp_up",
    "duration_s",
    "duration_grace_s",
    "warmup_requests",
    "trace_scale",
)


def _dataset_arrivals(
    src: Mapping[str, object], loc: Located, arrivals: Arrivals, dataset: Dataset | None
) -> Arrivals:
    """A trace brings its own schedule, so a rate or ramp beside it is refused, and `trace_scale`
    (default 1) stretches it; multi-turn sessions are a closed loop; any other workload leaves the
    arrivals as they are."""
    if dataset is not None and dataset.kind == "multi_turn" and arrivals.open_loop:
        raise loc.error(
            "workload",
            "request_rate",
            "cannot pace multi_turn sessions: each turn follows the last one's reply (a closed loop; "
            "`concurrency` sessions at once)",
        )
    trace_s = dataset.trace_s() if dataset is not None else None
    if trace_s is None:
        if "trace_scale" in src:
            raise loc.error(
                "workload", "trace_scale", 'scales a timed trace: it needs [workload.dataset] kind = "trace"'
            )
        return arrivals
    for key in ("request_rate", "ramp_up"):
        if key in src:
            raise loc.error("workload", key, "cannot be set with a trace, which brings its own schedule")
    scale = get_number(src, loc, "workload", "trace_scale", (int, float), BOUNDS["trace_scale"], 1.0)
    return dataclasses.replace(arrivals, trace_s=trace_s, trace_scale=float(scale))


def _number(src: Mapping[str, object], loc: Located, table: str, key: str) -> float | None:
    value = get_number(src, loc, table, key, (int, float), BOUNDS[key], None)
    return float(value) if value is not None else None


def _arrivals(src: Mapping[str, object], loc: Located, table: str) -> Arrivals:
    ramp = None
    if "ramp_up" in src:
        raw = get_table(src, loc, table, "ramp_up")
        reject_unknown_keys(raw, {"start_rate", "end_rate"}, loc, table)
        start = _number(raw, loc, table, "start_rate")
        end = _number(raw, loc, table, "end_rate")
        if start is None or end is None:
            raise loc.error(
                table, "ramp_up", "needs both rates: ramp_up = { start_rate = 1, end_rate = 8 } (requests/s)"
            )
        ramp = RampUp(start, end)
    fixed = src.get("burstiness") == math.inf  # the documented `inf`: evenly spaced arrivals
    burstiness = math.inf if fixed else _number(src, loc, table, "burstiness")
    arrivals = Arrivals(
        request_rate=_number(src, loc, table, "request_rate"),
        burstiness=burstiness if burstiness is not None else 1.0,
        ramp_up=ramp,
        duration_s=_number(src, loc, table, "duration_s"),
        duration_grace_s=float(
            get_number(
                src,
                loc,
                table,
                "duration_grace_s",
                (int, float),
                BOUNDS["duration_grace_s"],
                DURATION_GRACE_S,
            )
        ),
        warmup_requests=get_number(src, loc, table, "warmup_requests", int, BOUNDS["warmup_requests"], 0),
    )
    if "duration_grace_s" in src and arrivals.duration_s is None:
        raise loc.error(table, "duration_grace_s", "is the grace after duration_s: set duration_s too")
    if burstiness is not None and not arrivals.open_loop:
        raise loc.error(table, "burstiness", "shapes open-loop arrivals: set `request_rate` too")
    return arrivals


def _default_count(src: Mapping[str, object], arrivals: Arrivals, prompts: int, loc: Located) -> int:
    """num_requests when left out: enough arrivals to fill duration_s at the rate, else one per prompt."""
    rate = arrivals.mean_rate()
    if arrivals.duration_s is None or "num_requests" in src or arrivals.trace_s is not None:
        return prompts  # (a num_requests given overrides whatever default this is)
    if rate is None:
        raise loc.error(
            "workload",
            "duration_s",
            "needs `num_requests` in a closed loop (the most to send before the time is up), or a "
            "`request_rate`",
        )
    return max(1, math.ceil(rate * arrivals.duration_s))


TIMEOUT_KEYS = ("connect_timeout_s", "ttft_timeout_s", "stall_timeout_s", "request_timeout_s")


def _timeouts(src: Mapping[str, object], loc: Located, table: str) -> Timeouts:
    """Each key overrides its default; 0 is refused (it would cut every request), and a limit is
    switched off by leaving it out where its default is none, or by a day (the longest taken)."""
    defaults = Timeouts()
    values: dict[str, float | None] = {}
    for key in TIMEOUT_KEYS:
        value = get_number(src, loc, table, key, (int, float), BOUNDS[key], defaults.limit(key))
        values[key] = float(value) if value is not None else None
    return Timeouts(**values)


def _single_choice(extra_body: JSONObject, loc: Located, table: str) -> JSONObject:
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
