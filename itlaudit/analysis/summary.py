"""summary.json as types: the run summary and each variant's block, built by the derivation
(analysis/derive.py) and handed to the writers as these structs rather than as string-keyed dicts.

The JSON a struct encodes to is summary.json's content key for key, in the same order (field order is
the file's order; `categories`, `records` and `partial` are left out when empty, as before), so the
file and its readers did not change with the types. `format` is not a field: the writer stamps the
file (store/rundir.write_versioned) and the reader checks it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from itlaudit.errors import RecordsError
from itlaudit.model.jsonvalue import JSONObject
from itlaudit.model.vocabulary import QualityGate

# summarize()'s count/mean/p50/p90/p99 of one per-request figure (None where no request had it).
Figures = dict[str, float | int | None]


class LoopLag(msgspec.Struct, frozen=True):
    """The capture loops' lag over a variant: the worst request's p99 and the worst single stall."""

    worst_p99: float | None
    max: float | None


class VariantSummary(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One variant's block: per-request distributions (p50/p90/p99 over requests) of each
    SUMMARY_METRICS figure, vllm bench's run-level figures (`benchmark`), how the chunks were stamped,
    and finding counts (a run-level finding is counted in its variant's block too)."""

    requests: int
    errors: int
    model: str | None  # as sent (the served name); several joined by ", "
    token_source: dict[str, int]
    tokens_per_chunk_hist: dict[str, int]
    client_loop_lag_ms: LoopLag
    schedule_lag_ms: Figures
    # SUMMARY_METRICS (analysis/metrics.py), in its order
    itl_ms: Figures
    chunk_itl_ms: Figures
    itl_inflation: Figures
    ttft_ms: Figures
    tpot_ms: Figures
    e2e_ms: Figures
    tokens_per_chunk: Figures
    decode_tokens_per_chunk: Figures
    decode_tokens_per_s: Figures
    completion_tokens: Figures
    # analysis/benchmark.benchmark_figures: totals and throughputs, and distributions by vllm's names
    benchmark: dict[str, float | int | dict[str, float | int | None] | None]
    stamp: dict[str, int]
    findings: dict[str, int]
    categories: dict[str, dict[str, int | Figures]] = msgspec.field(default_factory=dict)  # by_category

    @property
    def distributions(self) -> dict[str, Figures]:
        """The per-request distributions by their summary.json key (SUMMARY_METRICS and the schedule
        lag): what a table row or a plot names by key reads through here."""
        return {
            "schedule_lag_ms": self.schedule_lag_ms,
            "itl_ms": self.itl_ms,
            "chunk_itl_ms": self.chunk_itl_ms,
            "itl_inflation": self.itl_inflation,
            "ttft_ms": self.ttft_ms,
            "tpot_ms": self.tpot_ms,
            "e2e_ms": self.e2e_ms,
            "tokens_per_chunk": self.tokens_per_chunk,
            "decode_tokens_per_chunk": self.decode_tokens_per_chunk,
            "decode_tokens_per_s": self.decode_tokens_per_s,
            "completion_tokens": self.completion_tokens,
        }


class RecordsSeen(msgspec.Struct, frozen=True):
    """How many lines requests.jsonl held when the summary was derived: a reader can tell a summary
    of the whole file from one of part of it."""

    file: str
    lines: int
    warmup: int


class PartialBy(msgspec.Struct, frozen=True):
    """The run still writing the folder when `report --live` derived this partial summary."""

    pid: int | None  # None while the holder had taken the lock but not yet written its name
    host: str | None


# What a summary.json written before a block's field existed lacks (the model, vllm bench's figures,
# the stamp counts, the schedule and loop lags): such a block reads with the field empty. Defaults on
# the struct would not do: a default is left out of the file when written, and these are not.
_BLOCK_BEFORE_FIELDS: dict[str, object] = {
    "model": None,
    "client_loop_lag_ms": {"worst_p99": None, "max": None},
    "schedule_lag_ms": {},
    "benchmark": {},
    "stamp": {},
}


class RunSummary(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """summary.json: per-variant blocks in scenario order, then run-level findings."""

    variants: dict[str, VariantSummary]
    run_findings: list[dict[str, Any]]
    records: RecordsSeen | None = None
    partial: PartialBy | None = None
    # Per variant, what its server and GPU said during the measured window and its per-request
    # acceptance (analysis.server_metrics.variant_server_figures); absent when nothing was sampled.
    server: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)
    # How output quality gates the figures (analysis.validity; the scenario's `quality_gate`), and the
    # variants whose launched server loads dummy weights (gibberish by construction): what the rule
    # and its phrase read, kept here so every reader of the folder judges it the same way.
    quality_gate: QualityGate = QualityGate.RELATIVE
    dummy_weights: list[str] = msgspec.field(default_factory=list)
    # variant -> how its acceptance was forced (meta.json's speculative_config, run_context's
    # synthetic_acceptance): its speed is a projection, never a result (analysis.validity)
    synthetic_acceptance: dict[str, str] = msgspec.field(default_factory=dict)

    @classmethod
    def from_json(cls, data: object, path: Path) -> RunSummary:
        """summary.json's content as read from `path` (its format already checked), this format or an
        earlier one; one that is not a summary is one RecordsError line."""
        try:
            if isinstance(data, Mapping) and isinstance(variants := data.get("variants"), Mapping):
                blocks = {
                    k: {**_BLOCK_BEFORE_FIELDS, **b} if isinstance(b, Mapping) else b
                    for k, b in variants.items()
                }
                data = {**data, "variants": blocks}
            return msgspec.convert(data, cls)
        except msgspec.ValidationError as exc:
            raise RecordsError(
                f"{path}: not a summary this itlaudit reads ({exc}); "
                f"derive it again: itlaudit report {path.parent}"
            ) from None

    def to_json(self) -> JSONObject:
        """summary.json's content (without `format`, which the writer stamps)."""
        data: JSONObject = msgspec.to_builtins(self)
        return data
