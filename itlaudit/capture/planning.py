"""What a variant will send, settled before any stream opens: the served model, the server's count of
ShareGPT reply lengths, a prefix-cache reset, and the planned requests with their schedule.

I/O only against the server's side endpoints (/v1/models, /tokenize, /reset_prefix_cache); the
planned requests themselves are built by pure functions from the scenario.

Preparation can be long (a large dataset's bodies encoded, its prompts tokenised): it reports its
progress through an `OnPrepare` callback (the coordinator's display lives in report/, above this
stage) and yields to the event loop as it goes, so a Ctrl-C, which asyncio delivers as a cancellation
at the next await, ends it within a fraction of a second.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypedDict

from itlaudit.capture.request_plan import PlannedRequest, Prompt, plan_request
from itlaudit.errors import ItlauditError, ServerRejectedError
from itlaudit.model.datasets import REPLY_KINDS
from itlaudit.model.jsonvalue import JSONObject
from itlaudit.model.scenario import Scenario
from itlaudit.model.scenario_toml import Located
from itlaudit.model.schedule import send_offsets_s
from itlaudit.side.client import SideClient, server_error_message

# Preparation's progress: (what is being done, how many of how many), e.g. ("encoding requests", 3, 8).
OnPrepare = Callable[[str, int, int], None]
_PACE_S = 0.1  # the most work done between two yields to the loop (and progress reports)


class Pacer:
    """Paces a long preparation loop: every `_PACE_S` of work it reports progress and yields to the
    event loop, so the loop's SIGINT cancellation can land; cheap enough to call per item."""

    def __init__(self, what: str, total: int, on_prepare: OnPrepare | None) -> None:
        self.what = what
        self.total = total
        self.on_prepare = on_prepare
        self._next = time.monotonic() + _PACE_S

    async def step(self, done: int) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + _PACE_S
        if self.on_prepare is not None:
            self.on_prepare(self.what, done, self.total)
        await asyncio.sleep(0)


class PrefixCacheReset(TypedDict, total=False):
    """meta.json's `reset_prefix_cache`: whether the cache was reset, and if not, why."""

    done: bool
    http_status: int
    note: str


async def reset_prefix_cache(client: SideClient, base_url: str) -> PrefixCacheReset:
    """POST vLLM's /reset_prefix_cache, so a variant does not start on what the one before it left in
    the cache. A dev-mode endpoint: where it is missing (404) or fails, the run goes on and the
    returned record (meta.json's `reset_prefix_cache`) carries the one line that says why."""
    url = base_url.rstrip("/") + "/reset_prefix_cache"
    try:
        answer = await client.reset_prefix_cache(base_url)
    except ItlauditError as exc:
        return {"done": False, "note": f"{exc}; the cache was not reset"}
    status, body = answer.status, answer.body
    if answer.ok:
        return {"done": True}
    if status == 404:
        note = (
            f"POST {url} answered 404: the server needs VLLM_SERVER_DEV_MODE=1 for /reset_prefix_cache; "
            "the cache was not reset"
        )
    else:
        reason = server_error_message(body, status)
        note = f"POST {url} answered HTTP {status} ({reason}); the cache was not reset"
    return {"done": False, "http_status": status, "note": note}


async def reply_lengths(
    client: SideClient,
    base_url: str,
    model: str,
    scenario: Scenario,
    on_prepare: OnPrepare | None = None,
) -> dict[int, int] | None:
    """A ShareGPT or multi-turn dataset's reply lengths in the served model's tokens, by entry index, from the
    server's /tokenize; None where it has none (the ~4 characters per token estimate stays)."""
    dataset = scenario.workload.dataset
    if dataset is None or dataset.kind not in REPLY_KINDS:
        return None
    lengths: dict[int, int] = {}
    pacer = Pacer("counting reply tokens", len(dataset.entries), on_prepare)
    try:
        for index, entry in enumerate(dataset.entries):
            await pacer.step(index)
            body: JSONObject = {"model": model, "prompt": entry.reply, "add_special_tokens": False}
            count = (await client.tokenize(base_url, body)).count
            if count < 1:
                return None
            lengths[index] = count
    except ItlauditError:
        return None
    return lengths


async def resolve_model(client: SideClient, base_url: str, wanted: str) -> str:
    """`auto` is the first served model; a named model must be served, or nothing would be measured."""
    served = list(await client.models(base_url))
    if not served:
        raise ServerRejectedError(f"{base_url}/v1/models lists no model; is the server fully started?")
    if wanted == "auto":
        return served[0]
    if wanted not in served:
        raise ServerRejectedError(
            f"model {wanted!r} is not served at {base_url} (served: {', '.join(served)}); "
            'fix `model` in the scenario or use model = "auto"'
        )
    return wanted


async def check_prompts_fit(client: SideClient, base_url: str, model: str, scenario: Scenario) -> None:
    """A token-id dataset's prompts (random, trace, prefix_repetition: their length is known without a
    tokenizer) must leave the served model room for at least one output token, where /v1/models
    states its max_model_len: otherwise every request would be refused, after a build that can take
    long for long prompts."""
    dataset = scenario.workload.dataset
    if dataset is None or not dataset.token_prompts:
        return
    limit = (await client.models(base_url)).get(model)
    longest = max(len(e.prompt) for e in dataset.entries if isinstance(e.prompt, list))
    if limit is None or longest < limit:
        return
    problem = (
        f"draws prompts of up to {longest} tokens, and {model} at {base_url} takes at most {limit} "
        "(max_model_len in /v1/models), output included; lower input_len below it"
    )
    raise _scenario_located(scenario).error("workload.dataset", "input_len", problem)


def _scenario_located(scenario: Scenario) -> Located:
    """The scenario file's lines, so a check made against the server still names file:line."""
    path = scenario.path
    try:
        text = path.read_text(encoding="utf-8") if path is not None else ""
    except (OSError, UnicodeDecodeError):
        text = ""
    return Located(path if path is not None else Path("command line"), text)


def sent_prompt(scenario: Scenario, index: int) -> Prompt:
    """What request `index` sends: its dataset line's messages or prompt, else the scenario's prompt
    (the distribution audit scores an output after the very prompt it followed)."""
    entry = scenario.entry_for(index)
    prompt = scenario.prompt_for(index)
    if entry is None:
        return prompt
    return entry.messages or (entry.prompt if entry.prompt is not None else prompt)


async def plan_variant(
    scenario: Scenario,
    variant: str,
    base_url: str,
    model: str,
    id_tag: str | None = None,
    reply_tokens: dict[int, int] | None = None,
    on_prepare: OnPrepare | None = None,
) -> list[PlannedRequest]:
    """Every request of the variant, warmup first, each with its scheduled offset in an open loop
    (the schedule depends on the seed only, so every variant sees the same arrivals; warmup and
    measured requests each have their own, from their phase's start); a measured arrival due after
    duration_s is never planned. Warmup ids are `<variant>.warmup-<i>`, apart from the measured
    ones, which keep the prompt index that pairs requests across variants. `reply_tokens` (entry index:
    tokens) replaces a ShareGPT entry's estimated max_tokens with the server's count. Each body is
    encoded once, here, paced (`Pacer`) so a large plan shows progress and a Ctrl-C ends it."""
    workload = scenario.workload
    arrivals = workload.arrivals
    warmup = arrivals.warmup_requests
    seed = workload.params.seed or 0

    def offsets(count: int) -> list[float | None]:
        return list(send_offsets_s(count, arrivals, seed)) if arrivals.open_loop else [None] * count

    # Each phase runs on its own clock (warmup finishes before the measured phase starts), so the
    # measured schedule is the same with or without warmup, and duration_s bounds the measured phase.
    schedule = [(True, s) for s in offsets(warmup)] + [(False, s) for s in offsets(workload.num_requests)]
    id_prefix = f"{variant}.{id_tag}" if id_tag else variant
    plans = []
    pacer = Pacer("encoding requests", len(schedule), on_prepare)
    for position, (is_warmup, offset_s) in enumerate(schedule):
        await pacer.step(position)
        past_duration = arrivals.duration_s is not None and (offset_s or 0.0) > arrivals.duration_s
        if past_duration and not is_warmup:
            break
        index = position if is_warmup else position - warmup
        entry = scenario.entry_for(index)
        prompt = sent_prompt(scenario, index)
        session, think_s = _session(scenario, index)
        params = workload.params
        if entry is not None:
            counted = (
                (reply_tokens or {}).get(index % len(workload.dataset.entries)) if workload.dataset else None
            )
            max_tokens = counted or entry.max_tokens
            params = dataclasses.replace(
                params,
                max_tokens=max_tokens if max_tokens is not None else params.max_tokens,
                ignore_eos=entry.ignore_eos if entry.ignore_eos is not None else params.ignore_eos,
            )
        plans.append(
            plan_request(
                base_url=base_url,
                endpoint=scenario.endpoint,
                model=model,
                prompt=prompt,
                params=params,
                request_id=f"{id_prefix}.warmup-{index:05d}" if is_warmup else f"{id_prefix}-{index:05d}",
                variant=variant,
                extra_body=workload.extra_body or None,
                scheduled_ms=offset_s * 1000 if offset_s is not None else None,
                warmup=is_warmup,
                category=entry.category if entry is not None else None,
                session=session,
                think_s=think_s,
            )
        )
    return plans


def _session(scenario: Scenario, index: int) -> tuple[int | None, float]:
    """A multi-turn entry's session (one id per pass over the dataset, as num_requests may cycle
    through it) and, past its first turn, the think time before it; (None, 0.0) for any other request."""
    dataset, entry = scenario.workload.dataset, scenario.entry_for(index)
    if dataset is None or entry is None or entry.session is None:
        return None, 0.0
    session = index // len(dataset.entries) * len(dataset.entries) + entry.session
    return session, dataset.think_time_s if (entry.turn or 1) > 1 else 0.0
