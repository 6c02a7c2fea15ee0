"""Per-request acceptance as the server reports it (vLLM's `--per-request-spec-decode-metrics`:
`metrics.speculative_decoding` on the final usage chunk; SGLang's `spec_*` keys of the last
/generate chunk's meta_info; either kept in the record as `spec_decode`, as sent), pooled for a group
of requests and checked against what the stream itself carried (pure)."""

from __future__ import annotations

from collections.abc import Iterable

from itlaudit.analysis.metrics import TOKEN_SOURCE_CHUNKS, TOKEN_SOURCE_TOKENIZER, token_counts
from itlaudit.model.codes import SPEC_DECODE_METRICS_DISAGREE, Finding
from itlaudit.model.jsonvalue import JSONObject, JSONValue
from itlaudit.model.records import RequestRecord, Status

# vLLM's metrics.speculative_decoding keys for each count (vllm/v1/metrics/stats.py).
_VLLM_KEYS = {
    "steps": "num_spec_steps",
    "accepted": "num_accepted_draft_tokens",
    "drafted": "num_draft_tokens",
    "k": "num_spec_tokens",
}
# SGLang's meta_info keys (tokenizer_manager.py, _calculate_spec_decoding_metrics): verify steps, and
# the accepted and proposed drafts under either spelling its builds have used. It sends no K: the
# drafts proposed per verify step are it (speculative_num_draft_tokens - 1).
_SGLANG_KEYS = {
    "steps": ("spec_verify_ct",),
    "accepted": ("spec_accept_token_num", "spec_accepted_drafts"),
    "drafted": ("spec_draft_token_num", "spec_proposed_drafts"),
}


def server_acceptance(record: RequestRecord) -> dict[str, int] | None:
    """The server's own counts for one request (vLLM's metrics.speculative_decoding, or SGLang's
    meta_info spec_* keys): verify steps, accepted and proposed draft tokens, K. None when the server
    sent none, an unreadable block, or SGLang's verify count without the draft counts (its builds
    that send only spec_verify_ct and spec_accept_length)."""
    block = record.spec_decode
    if not isinstance(block, dict):
        return None
    if "spec_verify_ct" in block:
        keys = {
            name: next((k for k in spelt if k in block), spelt[0]) for name, spelt in _SGLANG_KEYS.items()
        }
    else:
        keys = _VLLM_KEYS
    values = {name: block.get(key) for name, key in keys.items()}
    try:
        counts = {name: int(v) for name, v in values.items() if isinstance(v, int | float | str)}
    except ValueError:
        return None
    if len(counts) != len(keys):
        return None
    if "k" not in counts:
        counts["k"] = counts["drafted"] // counts["steps"] if counts["steps"] else 0
    return counts


def pooled_server_acceptance(records: Iterable[RequestRecord]) -> dict[str, float | int] | None:
    """Acceptance over requests from the server's per-request counts (vLLM's definitions: length =
    1 + accepted / steps, rate = accepted / drafted) and the K it ran at; None when no request carried
    them."""
    counts = [c for c in map(server_acceptance, records) if c is not None]
    if not counts:
        return None
    steps = sum(c["steps"] for c in counts)
    accepted = sum(c["accepted"] for c in counts)
    drafted = sum(c["drafted"] for c in counts)
    return {
        "requests": len(counts),
        "acceptance_length": 1.0 + accepted / steps if steps else 1.0,
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        # K as the server ran it (num_spec_tokens): the one fact about its speculation an attached
        # vLLM 0.32 gives, its /metrics carrying counters but no config (issue 35 item 2)
        "k": max(c["k"] for c in counts),
    }


def server_acceptance_finding(record: RequestRecord) -> Finding | None:
    """The server's accepted drafts checked against the stream. Each content chunk carries at least
    one engine step, and each step emits its accepted drafts plus one token, so the drafts a stream
    can have carried are at most its tokens minus its chunks; a stop or max_tokens can cut the last
    step, by at most K. A server claiming more than that is not describing this stream. (Fewer is
    allowed: steps without drafts, and steps merged into one chunk, both lower it.)"""
    counts = server_acceptance(record)
    if counts is None or record.status != Status.OK:
        return None
    _, cumulative, source = token_counts(record)
    if source in (TOKEN_SOURCE_CHUNKS, TOKEN_SOURCE_TOKENIZER) or cumulative.size == 0:
        return None  # tokens per chunk unknown (or re-counted, near but not exact): nothing to check
    stream_accepted = int(cumulative[-1]) - int(cumulative.size)
    if counts["accepted"] <= stream_accepted + counts["k"]:
        return None
    message = (
        f"The server reports {counts['accepted']} accepted draft tokens over {counts['steps']} steps "
        f"for this request, but its stream carried {int(cumulative[-1])} tokens in {cumulative.size} "
        f"chunks: at most {stream_accepted} accepted drafts (+{counts['k']} for a cut last step). "
        "The per-request acceptance does not describe this stream."
    )
    evidence = {
        "server_accepted": counts["accepted"],
        "server_steps": counts["steps"],
        "server_acceptance_length": _reported_length(record.spec_decode),
        "stream_tokens": int(cumulative[-1]),
        "stream_chunks": int(cumulative.size),
        "stream_accepted_max": stream_accepted,
        "k": counts["k"],
    }
    return Finding.of(SPEC_DECODE_METRICS_DISAGREE, message, evidence, record.request_id)


def _reported_length(block: JSONObject | None) -> JSONValue:
    """The acceptance length as the server wrote it: vLLM's mean_acceptance_length, SGLang's
    spec_accept_length (completion tokens over verify steps, so the prefill's token is in it)."""
    if not block:
        return None
    return block.get("mean_acceptance_length", block.get("spec_accept_length"))
