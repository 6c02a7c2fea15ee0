"""Lossless speculative decoding: at temperature 0 the K>0 output must equal the K=0 output.

Greedy speculative decoding is exact by construction (a draft token is kept only if it is the target's
argmax), so any difference is either a bug or bf16 batch variance: verifying K+1 positions in one step
is a different batch shape than decoding one, and a near-tie between the top two candidates can flip.
The check cannot tell which from the outputs alone, so it reports the first differing position, and
`with_divergence_logprobs` adds both servers' top candidates there so a human can: a margin of a few
hundredths of a nat is variance, a margin of several nats is a bug. Each finding ends with one
conclusion, never the two alternatives. Pure: records in, findings out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from itlaudit.analysis.invariance import TopLogprobs
from itlaudit.model.codes import SPEC_DECODE_OUTPUT_MISMATCH, Finding, Severity
from itlaudit.model.jsonvalue import JSONMapping, JSONObject, ReadOnlyJSON
from itlaudit.model.records import RequestRecord, Status

# Seed 000 measured bf16 batch variance of up to ~0.2 nats on a real model: a base-server margin
# below that between its top two candidates is a tie that variance can legitimately break.
NEAR_TIE_NATS = 0.2
# Every mismatch message ends with one conclusion sentence: "Conclusion: <what it is>: <severity>."
CONCLUSION = "Conclusion:"
UNSCORED = "not drawn, the servers' top logprobs at the divergence were not read"
_CONTEXT = 5
_SHOWN_CANDIDATES = 5


def prompt_index(record: RequestRecord) -> str:
    """The request's position in the workload: the runner names requests `<variant>-<index>`, so the
    same suffix on two variants means the same prompt."""
    return record.request_id.rpartition("-")[2]


def output_token_ids(record: RequestRecord) -> list[int] | None:
    """All output ids, or None if any content chunk lacked them: with gaps, positions would not line up."""
    chunks = record.chunks
    per_chunk = [ids for ids, choice in zip(chunks.token_ids, chunks.has_choice, strict=True) if choice]
    if not per_chunk or any(ids is None for ids in per_chunk):
        return None
    return [tok for ids in per_chunk if ids is not None for tok in ids]


def _first_difference(a: Sequence[object], b: Sequence[object]) -> int | None:
    for pos, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return pos
    return None if len(a) == len(b) else min(len(a), len(b))


def _greedy(record: RequestRecord) -> bool:
    return record.status == Status.OK and record.params.temperature == 0


def _mismatch(base: RequestRecord, spec: RequestRecord) -> Finding | None:
    base_ids, spec_ids = output_token_ids(base), output_token_ids(spec)
    unit = "token" if base_ids is not None and spec_ids is not None else "char"
    a: Sequence[int | str] = base_ids if base_ids is not None and unit == "token" else base.output
    b: Sequence[int | str] = spec_ids if spec_ids is not None and unit == "token" else spec.output
    pos = _first_difference(a, b)
    if pos is None:
        return None
    shorter = base if len(a) < len(b) else spec
    if pos == min(len(a), len(b)) and shorter.finish_reason == "length":
        return None  # one side was cut short: a truncation finding's business, not a lossless one
    base_at = a[pos] if pos < len(a) else None
    spec_at = b[pos] if pos < len(b) else None
    message = (
        f"Prompt {prompt_index(base)}: at temperature 0 the speculative output differs from the K=0 output "
        f"at {unit} {pos} ({base_at!r} vs {spec_at!r}); greedy speculative decoding is exact. "
        f"{CONCLUSION} {UNSCORED}: error."
    )
    evidence: JSONObject = {
        "prompt_index": prompt_index(base),
        "base_request_id": base.request_id,
        "spec_request_id": spec.request_id,
        "unit": unit,
        "position": pos,
        "base_value": base_at,
        "spec_value": spec_at,
        "context_before": [*a[max(0, pos - _CONTEXT) : pos]],
        "base_length": len(a),
        "spec_length": len(b),
        "base_finish_reason": base.finish_reason,
        "spec_finish_reason": spec.finish_reason,
    }
    return Finding.of(SPEC_DECODE_OUTPUT_MISMATCH, message, evidence, spec.request_id)


def spec_decode_mismatches(base: Sequence[RequestRecord], spec: Sequence[RequestRecord]) -> list[Finding]:
    """One finding per prompt whose greedy K=0 and K>0 outputs differ, paired by prompt index; pairs
    that are not both finished greedy requests are skipped (sampling is not expected to match)."""
    by_index = {prompt_index(r): r for r in base if _greedy(r)}
    found = []
    for record in spec:
        other = by_index.get(prompt_index(record))
        if other is not None and _greedy(record):
            finding = _mismatch(other, record)
            if finding is not None:
                found.append(finding)
    return found


def _shown(top: TopLogprobs) -> dict[str, float]:
    ranked = sorted(top.items(), key=lambda kv: kv[1], reverse=True)[:_SHOWN_CANDIDATES]
    return {str(tok): lp for tok, lp in ranked}


def _margin(top: TopLogprobs) -> float | None:
    ranked = sorted(top.values(), reverse=True)
    return ranked[0] - ranked[1] if len(ranked) > 1 else None


def _concluded(finding: Finding, conclusion: str, severity: Severity, evidence: JSONMapping) -> Finding:
    """The finding with its conclusion (the message's last sentence, "Conclusion: …: severity.")
    replaced: each reading of the divergence refines the one before, and only the last is said."""
    facts = finding.message.partition(f" {CONCLUSION} ")[0]
    message = f"{facts} {CONCLUSION} {conclusion}: {severity}."
    return replace(
        finding, severity=severity, message=message, evidence={**evidence, "conclusion": conclusion}
    )


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _rank(top: TopLogprobs, token: object) -> str:
    """Where the baseline ranks a token among the candidates it returned ("3rd"), or that it is not
    among them."""
    ranked = sorted(top, key=lambda t: top[t], reverse=True)
    if isinstance(token, int) and token in top:
        return _ordinal(ranked.index(token) + 1)
    return f"below its top {len(ranked)}"


def with_divergence_logprobs(finding: Finding, base_top: TopLogprobs, spec_top: TopLogprobs) -> Finding:
    """The finding plus both servers' top candidates at the differing position, and its conclusion. A
    base margin under NEAR_TIE_NATS (one bf16 step and a little) where the speculating server's own
    replay ranks K=0's token first is batch variance at a near tie: a warning, nothing is wrong with its
    verification, only the live batch shape broke the tie. Anything else is the speculating server
    writing a token the baseline ranks N-th: an error."""
    margin = _margin(base_top)
    near_tie = margin is not None and margin < NEAR_TIE_NATS
    evidence: dict[str, ReadOnlyJSON] = {
        **finding.evidence,
        "base_top_logprobs": _shown(base_top),
        "spec_top_logprobs": _shown(spec_top),
        "base_top2_margin": margin,
        "near_tie": near_tie,
    }
    base_token = finding.evidence.get("base_value")
    replay_agrees = (
        isinstance(base_token, int) and bool(spec_top) and spec_top.get(base_token) == max(spec_top.values())
    )
    evidence["replay_agrees"] = replay_agrees
    shown = "unknown (one candidate returned)" if margin is None else f"{margin:.3g} nats"
    if near_tie and replay_agrees:
        # Gemma 3 270M on an H200 (bf16, eager) showed 6 such flips in 16 greedy requests, each at a
        # margin of 0 or 0.125 nats (one bf16 step): real, reported, but not a spec-decode bug.
        conclusion = f"batch variance at a near tie (margin {shown}, replay agrees)"
        return _concluded(finding, conclusion, Severity.WARNING, evidence)
    replay = "replay agrees" if replay_agrees else "replay disagrees"
    rank = _rank(base_top, finding.evidence.get("spec_value"))
    conclusion = (
        f"the speculating server produced a token the baseline ranks {rank} (margin {shown}, {replay})"
    )
    return _concluded(finding, conclusion, Severity.ERROR, evidence)


def with_execution_modes(
    finding: Finding, base_mode: str | None, spec_mode: str | None, *, speculates: bool = True
) -> Finding:
    """A mismatch between servers of different execution modes (scenario.EXECUTION_MODES) is the two
    execution paths' numerics where it sits at a near tie, and always where the variant does not
    speculate (eager against CUDA graphs, no drafts): a warning that says so, with the margin, never
    the speculative-decoding rule's error. A clear margin under speculation (or unknown modes) keeps
    its conclusion. Measured: vLLM 0.24.0 on an H200, eager K0 vs CUDA-graph K3 diverged on every
    prompt at a K0 top-2 margin of 0 to 0.004 nats; Gemma 3 270M G0 eager vs graphs on an H100 raised
    8 mismatches, all at near ties."""
    if finding.code != SPEC_DECODE_OUTPUT_MISMATCH:
        return finding
    evidence: JSONMapping = {
        **finding.evidence,
        "base_execution_mode": base_mode,
        "spec_execution_mode": spec_mode,
    }
    differ = base_mode is not None and spec_mode is not None and base_mode != spec_mode
    if not (differ and (finding.evidence.get("near_tie") or not speculates)):
        return replace(finding, evidence=evidence)
    margin = finding.evidence.get("base_top2_margin")
    shown = f"margin {margin:.3g} nats" if isinstance(margin, int | float) else "margin not scored"
    why = "at a near tie" if finding.evidence.get("near_tie") else "and neither speculates"
    conclusion = f"numerics differ between execution modes ({base_mode} vs {spec_mode}) {why} ({shown})"
    return _concluded(finding, conclusion, Severity.WARNING, evidence)


def without_logprobs(finding: Finding, failure: str | None = None) -> Finding:
    """A mismatch no running server could score (a launched server stops after its variant), or whose
    scoring failed (`failure`, kept as `scoring_error`: the mismatch stands, unexplained): said as not
    concluded, with how to have it concluded or why not, at the registry's severity."""
    if finding.code != SPEC_DECODE_OUTPUT_MISMATCH or "conclusion" in finding.evidence:
        return finding
    if failure is not None:
        note = f"{UNSCORED}: scoring them failed ({failure})"
        return _concluded(finding, note, finding.severity, {**finding.evidence, "scoring_error": failure})
    note = f"{UNSCORED}; to conclude it, give both servers by URL (--variant NAME=URL) so compare scores it"
    return _concluded(finding, note, finding.severity, finding.evidence)
