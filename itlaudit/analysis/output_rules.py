"""Per-request rules on what was generated against what was asked: an output cut short, ignored
ignore_eos/min_tokens/stop ids, a contradictory stop reason, numeric gibberish. Pure: record and
metrics in, findings out (findings.request_findings runs them all)."""

from __future__ import annotations

from dataclasses import asdict

from itlaudit.analysis.metrics import TOKEN_SOURCE_CHUNKS, TOKEN_SOURCE_TOKENIZER, RequestMetrics
from itlaudit.analysis.quality import GibberishThresholds, gibberish_reasons, text_quality
from itlaudit.analysis.stream_rules import tokens_text
from itlaudit.model.codes import (
    GIBBERISH_SUSPECTED,
    IGNORE_EOS_VIOLATED,
    MIN_TOKENS_VIOLATED,
    PROMPT_TOKENS_MISMATCH,
    REASONING_TRUNCATED,
    STOP_REASON_UNEXPECTED,
    STOP_TOKEN_IDS_IGNORED,
    TRUNCATED_BELOW_MAX_TOKENS,
    Finding,
)
from itlaudit.model.records import RequestRecord, Status


def exact_tokens(record: RequestRecord, metrics: RequestMetrics) -> int | None:
    """The completion length when it is really known: a chunk count undercounts MTP output and would
    turn every speculative run into a false truncation, and a local tokenizer's re-count is near, not
    exact."""
    if record.completion_tokens is not None:
        return record.completion_tokens
    estimated = (TOKEN_SOURCE_CHUNKS, TOKEN_SOURCE_TOKENIZER)
    return metrics.completion_tokens if metrics.token_source not in estimated else None


def cut_short(record: RequestRecord, tokens: int | None) -> bool:
    """finish "length" that max_tokens does not explain: the server applied a cap of its own."""
    if record.finish_reason != "length":
        return False
    max_tokens = record.params.max_tokens
    return max_tokens is None or (tokens is not None and tokens < max_tokens)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _returned_ids(record: RequestRecord) -> list[int] | None:
    chunks = record.chunks
    per_chunk = [ids for ids, choice in zip(chunks.token_ids, chunks.has_choice, strict=True) if choice]
    if all(ids is None for ids in per_chunk):
        return None
    return [tok for ids in per_chunk if ids is not None for tok in ids]


# The OpenAI completions API's default max_tokens, which vLLM's /v1/completions applies when a request
# omits it (chat has no such default): a stop at exactly 16 is that default, not a generation config.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


def completions_default_stop(endpoint: str, max_tokens: int | None, tokens: int | None) -> bool:
    """A /v1/completions request without max_tokens that ended at the API's default of 16."""
    return endpoint == "completions" and max_tokens is None and tokens == COMPLETIONS_DEFAULT_MAX_TOKENS


COMPLETIONS_DEFAULT_TEXT = (
    f"{COMPLETIONS_DEFAULT_MAX_TOKENS} is vLLM's default max_tokens for /v1/completions (the OpenAI "
    "API's) when a request omits it: set max_tokens in the scenario's [workload]"
)


def truncation_finding(record: RequestRecord, tokens: int | None) -> Finding | None:
    if not cut_short(record, tokens):
        return None
    max_tokens = record.params.max_tokens
    if completions_default_stop(record.endpoint, max_tokens, tokens):
        message = (
            f"finish_reason is 'length' after {tokens} tokens and the request set no max_tokens: "
            f"{COMPLETIONS_DEFAULT_TEXT}."
        )
    elif max_tokens is None:
        message = (
            f"finish_reason is 'length' after {tokens_text(tokens)} tokens although the request set no "
            "max_tokens: a server-side cap (e.g. generation_config max_new_tokens) ended the output."
        )
    else:
        message = (
            f"finish_reason is 'length' after {tokens} tokens, below the requested max_tokens {max_tokens}: "
            "the server stopped the output early, so its latency is not comparable."
        )
    evidence = {
        "cap": tokens,
        "max_tokens": max_tokens,
        "request_set_max_tokens": max_tokens is not None,
        "completions_default": completions_default_stop(record.endpoint, max_tokens, tokens),
    }
    return Finding.of(TRUNCATED_BELOW_MAX_TOKENS, message, evidence, record.request_id)


def reasoning_truncated_finding(record: RequestRecord, tokens: int | None) -> Finding | None:
    """A thinking reply cut by its length before any answer: the reasoning channel carried text, the
    answer channel none, and the server said 'length'. Whatever the cap (max_tokens or the server's),
    the output has no answer, so it is a truncation like the others."""
    if record.finish_reason != "length" or not record.reasoning or record.text:
        return None
    thought = (
        ""
        if record.reasoning_tokens is None
        else f" ({record.reasoning_tokens} of them reasoning, by the server's usage)"
    )
    message = (
        f"finish_reason is 'length' after {tokens_text(tokens)} tokens{thought} while the reply was still "
        "in its reasoning channel: capped while thinking, no answer came. Its latency is a thinking "
        "stream's; raise max_tokens (or lower the reasoning budget) to measure answers."
    )
    evidence = {
        "cap": tokens,
        "max_tokens": record.params.max_tokens,
        "reasoning_tokens": record.reasoning_tokens,
        "reasoning_chars": len(record.reasoning),
    }
    return Finding.of(REASONING_TRUNCATED, message, evidence, record.request_id)


def ignore_eos_finding(record: RequestRecord, tokens: int | None) -> Finding | None:
    params = record.params
    if not params.ignore_eos or record.finish_reason != "stop":
        return None
    if _is_int(record.stop_reason) and record.stop_reason in params.stop_token_ids:
        return None
    message = (
        f"ignore_eos was set but the output stopped (finish_reason 'stop', stop_reason "
        f"{record.stop_reason!r}) after {tokens_text(tokens)} tokens, so the length is not what the "
        "benchmark asked for."
    )
    evidence = {
        "finish_reason": record.finish_reason,
        "stop_reason": record.stop_reason,
        "completion_tokens": tokens,
        "max_tokens": params.max_tokens,
    }
    return Finding.of(IGNORE_EOS_VIOLATED, message, evidence, record.request_id)


def min_tokens_finding(record: RequestRecord, tokens: int | None) -> Finding | None:
    min_tokens = record.params.min_tokens
    if min_tokens is None or record.status != Status.OK or tokens is None or tokens >= min_tokens:
        return None
    message = f"The request asked for min_tokens {min_tokens} but finished after {tokens} tokens."
    evidence = {"min_tokens": min_tokens, "completion_tokens": tokens, "finish_reason": record.finish_reason}
    return Finding.of(MIN_TOKENS_VIOLATED, message, evidence, record.request_id)


def stop_ids_finding(record: RequestRecord) -> Finding | None:
    stop_ids = set(record.params.stop_token_ids)
    ids = _returned_ids(record)
    if not stop_ids or ids is None:
        return None
    # Inside the first min_tokens tokens a stop id is legitimately not a stop; the last token may be the
    # stop itself on a normal "stop" finish, but not when the output ran on to the length limit.
    first = record.params.min_tokens or 0
    last = len(ids) if record.finish_reason == "length" else len(ids) - 1
    hits = [pos for pos in range(first, last) if ids[pos] in stop_ids]
    if not hits:
        return None
    pos = hits[0]
    message = (
        f"Requested stop token {ids[pos]} appears at position {pos} of {len(ids)} returned tokens "
        f"(finish_reason {record.finish_reason!r}), but generation did not stop there."
    )
    evidence = {
        "position": pos,
        "token_id": ids[pos],
        "occurrences": len(hits),
        "returned_tokens": len(ids),
        "min_tokens": record.params.min_tokens,
        "finish_reason": record.finish_reason,
        "stop_token_ids": sorted(stop_ids),
    }
    return Finding.of(STOP_TOKEN_IDS_IGNORED, message, evidence, record.request_id)


def stop_reason_finding(record: RequestRecord) -> Finding | None:
    finish, reason = record.finish_reason, record.stop_reason
    stop_ids = record.params.stop_token_ids
    if finish == "stop" and _is_int(reason) and reason not in stop_ids:
        message = f"The output stopped on token {reason}, which is not among the requested stop_token_ids."
    elif reason is not None and finish in ("length", None):
        message = f"stop_reason is {reason!r} but finish_reason is {finish!r}: the two contradict each other."
    else:
        return None
    evidence = {"finish_reason": finish, "stop_reason": reason, "stop_token_ids": list(stop_ids)}
    return Finding.of(STOP_REASON_UNEXPECTED, message, evidence, record.request_id)


# Slack for a server that adds one token to a token-id prompt (a BOS): anything more is another prompt.
PROMPT_TOKENS_SLACK = 1


def prompt_tokens_finding(record: RequestRecord) -> Finding | None:
    """The server's count of the prompt against the token-id prompt's length as sent: a server that
    truncated it (`truncate_prompt_tokens`, a context limit) or re-tokenized it ran a shorter or
    longer prefill than the workload's, so its TTFT and throughput describe another workload."""
    sent, counted = record.sent_prompt_tokens, record.prompt_tokens
    if sent is None or counted is None or abs(counted - sent) <= PROMPT_TOKENS_SLACK:
        return None
    message = (
        f"The server counted {counted} prompt tokens for a prompt of {sent} token ids as sent: it "
        f"{'truncated' if counted < sent else 'extended'} the prompt, so this request's prefill (and "
        "its TTFT) is not the workload's."
    )
    evidence = {"sent_prompt_tokens": sent, "server_prompt_tokens": counted}
    return Finding.of(PROMPT_TOKENS_MISMATCH, message, evidence, record.request_id)


def gibberish_finding(record: RequestRecord, thresholds: GibberishThresholds) -> Finding | None:
    quality = text_quality(record.output)
    reasons = gibberish_reasons(quality, thresholds)
    if not reasons:
        return None
    message = (
        f"The output looks like numeric gibberish ({'; '.join(reasons)}): a decode path may be broken, "
        "so this server's latency is not worth comparing."
    )
    if record.params.ignore_eos:
        message += " It was generated with ignore_eos; confirm with natural EOS before blaming the server."
    evidence = {**quality.to_json(), "ignore_eos": record.params.ignore_eos, "thresholds": asdict(thresholds)}
    return Finding.of(GIBBERISH_SUSPECTED, message, evidence, record.request_id)
