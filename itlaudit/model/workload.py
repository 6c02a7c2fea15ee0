"""The [workload] table: prompts (list, file or dataset), request parameters, arrivals and timeouts."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from itlaudit.model.datasets import Dataset, DatasetError, load_dataset
from itlaudit.model.records import RequestParams, Timeouts
from itlaudit.model.scenario_toml import (
    Located,
    get_value,
    int_list,
    reject_unknown_keys,
    require_positive,
    str_list,
)
from itlaudit.model.schedule import Arrivals, RampUp

__all__ = ["ARRIVAL_KEYS", "TIMEOUT_KEYS", "Workload", "parse_workload"]


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


def parse_workload(src: dict[str, Any], loc: Located, base: Path, chat: bool) -> Workload:
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
    max_tokens = get_value(src, loc, table, "max_tokens", int, None)
    min_tokens = get_value(src, loc, table, "min_tokens", int, None)
    if max_tokens is not None:
        require_positive(max_tokens, loc, table, "max_tokens")
    if min_tokens is not None and min_tokens < 0:
        raise loc.error(table, "min_tokens", f"must be at least 0, got {min_tokens}")
    if min_tokens is not None and max_tokens is not None and min_tokens > max_tokens:
        raise loc.error(table, "min_tokens", f"({min_tokens}) is larger than max_tokens ({max_tokens})")
    temperature = get_value(src, loc, table, "temperature", (int, float), None)
    params = RequestParams(
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        ignore_eos=get_value(src, loc, table, "ignore_eos", bool, False),
        stop_token_ids=int_list(src, loc, table, "stop_token_ids"),
        temperature=float(temperature) if temperature is not None else None,
        seed=get_value(src, loc, table, "seed", int, None),
    )
    num_requests = require_positive(
        get_value(src, loc, table, "num_requests", int, _default_count(src, arrivals, len(prompts), loc)),
        loc,
        table,
        "num_requests",
    )
    # With a rate, concurrency is only a cap; absent, nothing caps the open requests.
    uncapped = num_requests + arrivals.warmup_requests if arrivals.open_loop else 1
    return Workload(
        prompts=prompts,
        num_requests=num_requests,
        concurrency=require_positive(
            get_value(src, loc, table, "concurrency", int, uncapped), loc, table, "concurrency"
        ),
        params=params,
        extra_body=_single_choice(get_value(src, loc, table, "extra_body", dict, {}), loc, table),
        timeouts=_timeouts(src, loc, table),
        arrivals=arrivals,
        dataset=dataset,
    )


def _dataset(src: dict[str, Any], loc: Located, base: Path, chat: bool, arrivals: Arrivals) -> Dataset:
    """[workload.dataset]; a random one draws as many requests as will be sent (num_requests, or what
    duration_s holds at the rate)."""
    table = "workload.dataset"
    raw = get_value(src, loc, "workload", "dataset", dict)
    count = 0
    if raw.get("kind") == "random":
        if "num_requests" in src:
            count = require_positive(
                get_value(src, loc, "workload", "num_requests", int), loc, "workload", "num_requests"
            )
        elif arrivals.duration_s is not None and arrivals.mean_rate() is not None:
            count = _default_count(src, arrivals, 0, loc)
        else:
            raise loc.error(
                "workload", "num_requests", "is missing; a random dataset draws that many requests"
            )
    seed = get_value(src, loc, "workload", "seed", int, None) or 0
    try:
        return load_dataset(raw, base, count, seed, chat)
    except DatasetError as exc:
        raise loc.error(table, exc.key, str(exc)) from None


ARRIVAL_KEYS = ("request_rate", "burstiness", "ramp_up", "duration_s", "warmup_requests")


def _positive_number(src: dict[str, Any], loc: Located, table: str, key: str) -> float | None:
    value = get_value(src, loc, table, key, (int, float), None)
    if value is not None and not value > 0:
        raise loc.error(table, key, f"must be a positive number, got {value!r}")
    return float(value) if value is not None else None


def _arrivals(src: dict[str, Any], loc: Located, table: str) -> Arrivals:
    ramp = None
    if "ramp_up" in src:
        raw = get_value(src, loc, table, "ramp_up", dict)
        reject_unknown_keys(raw, {"start_rate", "end_rate"}, loc, table)
        start = _positive_number(raw, loc, table, "start_rate")
        end = _positive_number(raw, loc, table, "end_rate")
        if start is None or end is None:
            raise loc.error(
                table, "ramp_up", "needs both rates: ramp_up = { start_rate = 1, end_rate = 8 } (requests/s)"
            )
        ramp = RampUp(start, end)
    burstiness = _positive_number(src, loc, table, "burstiness")
    warmup = get_value(src, loc, table, "warmup_requests", int, 0)
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


def _default_count(src: dict[str, Any], arrivals: Arrivals, prompts: int, loc: Located) -> int:
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


def _timeouts(src: dict[str, Any], loc: Located, table: str) -> Timeouts:
    """Each key overrides its default; 0 is refused (it would cut every request), and a limit is
    switched off by leaving it out where its default is none, or by a very large number."""
    defaults = Timeouts()
    values: dict[str, float | None] = {}
    for key in TIMEOUT_KEYS:
        value = get_value(src, loc, table, key, (int, float), defaults.limit(key))
        if value is not None and value <= 0:
            raise loc.error(table, key, f"must be a positive number of seconds, not {value}")
        values[key] = float(value) if value is not None else None
    return Timeouts(**values)


def _single_choice(extra_body: dict[str, Any], loc: Located, table: str) -> dict[str, Any]:
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
