"""Batch-composition invariance figures from scored prompts: pure functions, no I/O.

Seed 000: a prompt's top-20 logprobs moved by up to 0.2 when another sequence shared its engine step,
and by up to 0.17 between two runs of the *same* batch, because whether the two rows really shared a
step depended on when they reached the engine core. Telling those apart needs the four scorings the
seed used: alone, alone repeated, a batch of two identical prompts forced into one step, and that batch
repeated. The figures are max |Δlogprob| over candidate ids present in both top-k lists (a candidate
missing from one list has no logprob to compare, and counts as a set difference instead).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from itlaudit.errors import ServerRejectedError
from itlaudit.model.jsonvalue import JSONObject, JSONValue

# One scored position: candidate token id → logprob.
TopLogprobs = dict[int, float]

TOKEN_ID_PREFIX = "token_id:"
DEFAULT_SWEEP_SIZES = (1, 2, 4, 8, 16)


def parse_top_logprobs(body: Mapping[str, Any]) -> list[list[TopLogprobs]]:
    """Per choice (in `index` order), per generated position, the top candidates keyed by token id.

    Ids, not strings: two distinct tokens can render to the same text (byte pieces, U+FFFD), which
    would silently merge candidates; `return_tokens_as_token_ids` makes vLLM key them "token_id:N".
    """
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices:
        raise ServerRejectedError("the completion response has no choices; is this a vLLM server?")
    rows = []
    for choice in sorted(choices, key=lambda c: c.get("index", 0)):
        logprobs = choice.get("logprobs")
        if not isinstance(logprobs, dict) or not isinstance(logprobs.get("top_logprobs"), list):
            raise ServerRejectedError(
                "the server returned no logprobs for a request that asked for them; "
                "it may not support `logprobs` on /v1/completions"
            )
        rows.append([_keyed_by_id(position) for position in logprobs["top_logprobs"]])
    return rows


def _keyed_by_id(position: Mapping[str, float]) -> TopLogprobs:
    out: TopLogprobs = {}
    for key, value in position.items():
        if not key.startswith(TOKEN_ID_PREFIX):
            raise ServerRejectedError(
                f"logprob candidate {key!r} is not keyed 'token_id:N': the server ignored "
                "return_tokens_as_token_ids (vLLM added it in 0.6; SGLang's /v1/completions keys "
                "candidates by text, and an SGLang server that says so in /server_info is scored "
                "on /generate), so candidates cannot be matched by id"
            )
        out[int(key.removeprefix(TOKEN_ID_PREFIX))] = float(value)
    return out


def parse_generate_top_logprobs(body: JSONValue) -> list[list[TopLogprobs]]:
    """SGLang's /generate answer (one object, or a list for a `text` list) as parse_top_logprobs's
    rows: per row, per generated position, the candidates keyed by id. SGLang 0.5.12 sends them in
    `meta_info.output_top_logprobs` as [logprob, token_id, text or None] per candidate
    (srt/managers/tokenizer_manager.py `detokenize_top_logprobs_tokens`); its /v1/completions keys
    them by text only, which is why SGLang is scored here."""
    rows = body if isinstance(body, list) else [body]
    out = []
    for row in rows:
        meta = row.get("meta_info") if isinstance(row, dict) else None
        positions = meta.get("output_top_logprobs") if isinstance(meta, dict) else None
        if not isinstance(positions, list):
            raise ServerRejectedError(
                "the /generate answer has no meta_info.output_top_logprobs for a request that asked "
                "for them (return_logprob, top_logprobs_num); is this an SGLang server?"
            )
        out.append([_entries_by_id(position) for position in positions])
    return out


def _entries_by_id(position: JSONValue) -> TopLogprobs:
    """One position's [logprob, token_id, text] candidates by id (SGLang sends None for a position
    without candidates)."""
    out: TopLogprobs = {}
    for entry in position if isinstance(position, list) else []:
        logprob, token = (entry[0], entry[1]) if isinstance(entry, list) and len(entry) >= 2 else (None, None)
        if not isinstance(logprob, int | float) or not isinstance(token, int) or isinstance(token, bool):
            raise ServerRejectedError(
                f"a /generate top-logprobs candidate is not [logprob, token_id, text]: {str(entry)[:100]}"
            )
        out[token] = float(logprob)
    return out


def max_abs_delta(a: TopLogprobs, b: TopLogprobs) -> float:
    """Largest logprob move among candidates both lists contain; 0.0 when they share none (the set
    difference then says everything)."""
    return max((abs(a[tok] - b[tok]) for tok in a.keys() & b.keys()), default=0.0)


def set_difference(a: TopLogprobs, b: TopLogprobs) -> int:
    """Candidates in one top-k list but not the other."""
    return len(a.keys() ^ b.keys())


def decision(top: TopLogprobs, choices: Sequence[int] | None) -> int | None:
    """The choice a caller would make: argmax over the given choice tokens (absent ones cannot win),
    or over every candidate when no choices are given; None when no choice token is present."""
    candidates = [tok for tok in (choices if choices else top) if tok in top]
    return max(candidates, key=lambda tok: (top[tok], -tok)) if candidates else None


@dataclass
class PromptObservations:
    """Raw scorings of one prompt, as the server returned them (position 0, max_tokens=1)."""

    prompt: str
    alone: list[TopLogprobs]
    batch2: list[list[TopLogprobs]]  # N batches × 2 rows, both rows in one /v1/completions prompt list
    concurrent: list[list[TopLogprobs]] = field(default_factory=list)  # N × 2 separate requests
    sweep: dict[int, list[TopLogprobs]] = field(default_factory=dict)  # copies in one list → rows

    def to_json(self) -> JSONObject:
        def rows(tops: Sequence[TopLogprobs]) -> list[JSONValue]:
            return [{str(k): v for k, v in top.items()} for top in tops]

        return {
            "prompt": self.prompt,
            "alone": rows(self.alone),
            "batch2": [rows(batch) for batch in self.batch2],
            "concurrent": [rows(pair) for pair in self.concurrent],
            "sweep": {str(size): rows(tops) for size, tops in self.sweep.items()},
        }


@dataclass(frozen=True)
class PairFigures:
    """A batched mode against alone and against its own first repeat."""

    vs_alone: float  # max |Δlogprob| of any row against the first alone scoring
    repeat: float  # max |Δlogprob| of any row against the same row of the first batch
    set_diff_vs_alone: int  # largest top-k set difference of any row against alone
    identical_to_alone: int  # batches whose every row is bitwise equal to alone
    rows_identical: int  # batches whose rows are bitwise equal to each other
    flipped: int  # batches in which some row's decision differs from alone's
    batches: int


def _pair_figures(
    alone: TopLogprobs, batches: Sequence[Sequence[TopLogprobs]], choices: Sequence[int] | None
) -> PairFigures:
    first = batches[0]
    rows = [(i, row) for batch in batches for i, row in enumerate(batch)]
    return PairFigures(
        vs_alone=max(max_abs_delta(alone, row) for _, row in rows),
        repeat=max(max_abs_delta(first[i], row) for i, row in rows),
        set_diff_vs_alone=max(set_difference(alone, row) for _, row in rows),
        identical_to_alone=sum(all(row == alone for row in batch) for batch in batches),
        rows_identical=sum(all(row == batch[0] for row in batch) for batch in batches),
        flipped=sum(
            any(decision(row, choices) != decision(alone, choices) for row in batch) for batch in batches
        ),
        batches=len(batches),
    )


@dataclass(frozen=True)
class SweepFigures:
    """Every copy in a list of `size` against the single-copy scoring: all 0.0 means batch-invariant."""

    max_delta: dict[int, float]
    identical: dict[int, bool]

    @property
    def invariant(self) -> bool:
        return all(self.identical.values())


def _sweep_figures(sweep: Mapping[int, Sequence[TopLogprobs]]) -> SweepFigures | None:
    if not sweep:
        return None
    reference = sweep[min(sweep)][0]
    return SweepFigures(
        max_delta={size: max(max_abs_delta(reference, row) for row in rows) for size, rows in sweep.items()},
        identical={size: all(row == reference for row in rows) for size, rows in sweep.items()},
    )


@dataclass(frozen=True)
class PromptFigures:
    prompt: str
    alone_repeat: float
    alone_set_diff: int
    alone_identical: int  # alone scorings bitwise equal to the first
    batch2: PairFigures
    concurrent: PairFigures | None
    sweep: SweepFigures | None


def prompt_figures(obs: PromptObservations, choices: Sequence[int] | None = None) -> PromptFigures:
    if not obs.alone or not obs.batch2:
        raise ValueError("invariance figures need at least one alone scoring and one batch")
    first = obs.alone[0]
    return PromptFigures(
        prompt=obs.prompt,
        alone_repeat=max(max_abs_delta(first, top) for top in obs.alone),
        alone_set_diff=max(set_difference(first, top) for top in obs.alone),
        alone_identical=sum(top == first for top in obs.alone),
        batch2=_pair_figures(first, obs.batch2, choices),
        concurrent=_pair_figures(first, obs.concurrent, choices) if obs.concurrent else None,
        sweep=_sweep_figures(obs.sweep),
    )


def _total(pairs: Sequence[PairFigures]) -> dict[str, float | int]:
    return {
        "vs_alone": max(p.vs_alone for p in pairs),
        "repeat": max(p.repeat for p in pairs),
        "set_diff_vs_alone": max(p.set_diff_vs_alone for p in pairs),
        "identical_to_alone": sum(p.identical_to_alone for p in pairs),
        "rows_identical": sum(p.rows_identical for p in pairs),
        "batches": sum(p.batches for p in pairs),
        "prompts_flipped": sum(p.flipped > 0 for p in pairs),
    }


def summarize(figures: Sequence[PromptFigures]) -> dict[str, Any]:
    """The seed's headline figures over a prompt set: maxima of the deltas, totals of the counts."""
    if not figures:
        raise ValueError("no prompts were scored")
    batch = _total([f.batch2 for f in figures])
    concurrent = [f.concurrent for f in figures if f.concurrent is not None]
    sweeps = [f.sweep for f in figures if f.sweep is not None]
    out: dict[str, Any] = {
        "prompts": len(figures),
        "alone_repeat": max(f.alone_repeat for f in figures),
        "alone_vs_batch2": batch["vs_alone"],
        "batch2_repeat": batch["repeat"],
        "top_set_diff_alone_repeat": max(f.alone_set_diff for f in figures),
        "top_set_diff_alone_vs_batch2": batch["set_diff_vs_alone"],
        "batch2_identical_to_alone": batch["identical_to_alone"],
        "batch2_rows_identical": batch["rows_identical"],
        "batch2_batches": batch["batches"],
        "decision_flip_rate": batch["prompts_flipped"] / len(figures),
        "concurrent": _total(concurrent) if concurrent else None,
        "sweep": None,
    }
    if sweeps:
        sizes = sorted({size for s in sweeps for size in s.max_delta})
        out["sweep"] = {
            "max_delta": {size: max(s.max_delta.get(size, 0.0) for s in sweeps) for size in sizes},
            "invariant": all(s.invariant for s in sweeps),
        }
    return out


def figures_json(figures: Sequence[PromptFigures]) -> list[JSONObject]:
    return [asdict(f) for f in figures]
