"""Every finding code itlaudit can emit, in one registry: its severity, where it applies, what it means.

A code is the stable name a finding carries into derived.jsonl, summary.json, compare.json, `diff`,
`bisect --regress finding:CODE` and smoke suites, so it is defined once, here, and the rules in
`itlaudit.analysis` only pick one. The findings table in docs/audits.md is checked against this registry
by tests/test_codes.py. To add a code: register it below (that test then names the row to add),
write its rule in analysis/, and give it one test that makes it fire and one that keeps it quiet.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from itlaudit.model.jsonvalue import JSONMapping


class Severity(StrEnum):
    """error: the figures cannot be taken at face value; warning: worth knowing, not wrong."""

    ERROR = "error"
    WARNING = "warning"


class Scope(StrEnum):
    """What a finding judges, which is also where it is written."""

    REQUEST = "request"  # one request (derived.jsonl)
    VARIANT = "variant"  # a variant's requests together (summary.json's run_findings)
    COMPARISON = "comparison"  # a variant against the baseline variant (compare.json)


@dataclass(frozen=True)
class FindingCode:
    """A code's registry entry. `severities` lists the severities its rule may emit, the usual first."""

    code: str
    severities: tuple[Severity, ...]
    scope: Scope
    meaning: str
    truncation: bool = False  # the output is shorter than the request asked for

    @property
    def severity(self) -> Severity:
        return self.severities[0]


REGISTRY: dict[str, FindingCode] = {}

_ERROR = (Severity.ERROR,)
_WARNING = (Severity.WARNING,)


def _register(
    code: str, severities: tuple[Severity, ...], scope: Scope, meaning: str, *, truncation: bool = False
) -> str:
    if code in REGISTRY:
        raise ValueError(f"finding code {code!r} registered twice")
    REGISTRY[code] = FindingCode(code, severities, scope, meaning, truncation)
    return code


TRUNCATED_BELOW_MAX_TOKENS = _register(
    "truncated_below_max_tokens",
    _ERROR,
    Scope.REQUEST,
    "finish_reason 'length' below the requested max_tokens, or with none set: a server-side cap ended "
    "the output (16 tokens on /v1/completions without max_tokens is the API default, and says so)",
    truncation=True,
)
REASONING_TRUNCATED = _register(
    "reasoning_truncated",
    _ERROR,
    Scope.REQUEST,
    "finish_reason 'length' while the reply was still in its reasoning channel: capped while thinking, "
    "no answer came, so its figures are a thinking stream's, not an answer's",
    truncation=True,
)
IGNORE_EOS_VIOLATED = _register(
    "ignore_eos_violated",
    _ERROR,
    Scope.REQUEST,
    "ignore_eos was set but the output stopped on something other than a requested stop token",
    truncation=True,
)
MIN_TOKENS_VIOLATED = _register(
    "min_tokens_violated",
    _ERROR,
    Scope.REQUEST,
    "a finished request returned fewer tokens than its min_tokens",
    truncation=True,
)
STOP_TOKEN_IDS_IGNORED = _register(
    "stop_token_ids_ignored",
    _ERROR,
    Scope.REQUEST,
    "a requested stop token id appears in the output (past min_tokens) but generation went on",
)
STOP_REASON_UNEXPECTED = _register(
    "stop_reason_unexpected",
    _WARNING,
    Scope.REQUEST,
    "the output stopped on a token that was not requested, or stop_reason contradicts finish_reason",
)
USAGE_MISSING = _register(
    "usage_missing",
    (Severity.ERROR, Severity.WARNING),
    Scope.REQUEST,
    "no per-chunk usage: ITL counts chunks as tokens (error), or the returned token ids or a local "
    "tokenizer's counts (`--tokenizer`; warning)",
)
USAGE_NON_MONOTONIC = _register(
    "usage_non_monotonic",
    _ERROR,
    Scope.REQUEST,
    "the cumulative usage.completion_tokens went down between chunks, so the token ITL cannot be trusted",
)
STREAM_ERROR = _register(
    "stream_error",
    _ERROR,
    Scope.REQUEST,
    'the stream failed: vLLM\'s `data: {"error": ...}` frame when the engine dies, a non-SSE 200, a '
    "chunk of the wrong shape",
)
NO_DONE_SENTINEL = _register(
    "no_done_sentinel",
    _WARNING,
    Scope.REQUEST,
    "the stream closed without `data: [DONE]`, so it may have been cut off",
)
HTTP_ERROR = _register(
    "http_error",
    _ERROR,
    Scope.REQUEST,
    "the server answered with an HTTP error status (other than 429/503)",
)
CONNECTION_ERROR = _register(
    "connection_error",
    _ERROR,
    Scope.REQUEST,
    "the connection was refused, reset or dropped mid-request",
)
COMMON_CAP = _register(
    "common_cap",
    _ERROR,
    Scope.VARIANT,
    "3 or more requests, at least half of a variant's finished ones, stopped at one identical length "
    "with finish_reason 'length' below max_tokens: a server-side cap, not latency, explains its numbers",
)
LAUNCH_BOUND = _register(
    "launch_bound",
    _WARNING,
    Scope.VARIANT,
    "the token ITL sits under 10% of the memory-bandwidth floor's speed while NVML saw the GPU busy "
    "under half the time: the step waits on kernel launches or the CPU, so its speed moves with the host",
)
PROMPT_TOKENS_MISMATCH = _register(
    "prompt_tokens_mismatch",
    _WARNING,
    Scope.REQUEST,
    "the server's usage.prompt_tokens differs from the token-id prompt's length as sent (by more than "
    "one token): it truncated or re-tokenized the prompt, so this request ran another workload",
)
GIBBERISH_SUSPECTED = _register(
    "gibberish_suspected",
    _WARNING,
    Scope.REQUEST,
    "the output looks like numeric gibberish (digit ratio, runs of digits/punctuation, repeated "
    "numbers; thresholds from the seed's clean and broken outputs)",
)
CHUNKS_COALESCED = _register(
    "chunks_coalesced",
    _WARNING,
    Scope.REQUEST,
    "more than a quarter of the chunk gaps were zero: chunks arrived in bursts, and the finding says "
    "whether the client was busy",
)
STREAM_STALLED = _register(
    "stream_stalled",
    _ERROR,
    Scope.REQUEST,
    "a timeout cut the request: the silence, and after how many tokens",
)
CUT_BY_DURATION = _register(
    "cut_by_duration",
    _WARNING,
    Scope.REQUEST,
    "the run's duration_s and its grace (duration_grace_s) ran out while the stream was open: itlaudit "
    "cut it, so it is not measured, and the variant's measured requests are its shorter ones",
)
RATE_LIMITED = _register(
    "rate_limited",
    _WARNING,
    Scope.REQUEST,
    "HTTP 429/503, with Retry-After; the workload goes on and the request is not measured",
)
INVALID_UTF8 = _register(
    "invalid_utf8",
    _WARNING,
    Scope.REQUEST,
    "a chunk's bytes were not UTF-8; its text was kept with U+FFFD in place of the bad bytes",
)
CHOICES_INTERLEAVED = _register(
    "choices_interleaved",
    _ERROR,
    Scope.REQUEST,
    "chunks carried a choices[].index other than 0: the server interleaved several replies (n > 1), "
    "so the stream is not one reply and is not measured; index 0's text is kept",
)
CLIENT_SATURATED = _register(
    "client_saturated",
    _WARNING,
    Scope.REQUEST,
    "itlaudit's own capture loop lagged past 5% of the token ITL (loop stamps) or all of it (kernel "
    "stamps): the client is in the figure",
)
SPEC_DECODE_METRICS_DISAGREE = _register(
    "spec_decode_metrics_disagree",
    _ERROR,
    Scope.REQUEST,
    "the server's per-request acceptance (metrics.speculative_decoding) claims more accepted drafts "
    "than the stream's decode chunks carried, beyond one step's cut at the end: both figures given",
)
ACCEPTANCE_LENGTH_MISMATCH = _register(
    "acceptance_length_mismatch",
    _ERROR,
    Scope.COMPARISON,
    "stream and /metrics acceptance length more than 10% apart, and their accepted tokens disagree "
    "too or /metrics counts more drafting steps than the stream has decode steps",
)
STREAM_BUNDLED = _register(
    "stream_bundled",
    _WARNING,
    Scope.COMPARISON,
    "decode chunks carried more tokens than one engine step makes (K+1, K from the /metrics window): the "
    "server bundles steps into a chunk (--stream-interval), so chunk ITL is per chunk of several steps",
)
SPEC_DECODE_OUTPUT_MISMATCH = _register(
    "spec_decode_output_mismatch",
    (Severity.ERROR, Severity.WARNING),
    Scope.COMPARISON,
    "at temperature 0 the K>0 output differs from K0's (first differing position, both servers' top "
    "logprobs there); a warning at a near tie between servers of different execution modes",
)
SPEC_DECODE_DISTRIBUTION_SHIFT = _register(
    "spec_decode_distribution_shift",
    _ERROR,
    Scope.COMPARISON,
    "at temperature > 0 the K>0 outputs are more or less likely under the K0 server than K0's own "
    "(per-token log-likelihood, Mann–Whitney p < 0.01 and a shift of at least 0.1 nats/token): "
    "speculative sampling changed the output distribution",
)

CODES: tuple[str, ...] = tuple(REGISTRY)
# The one definition of a truncated request: any of these codes (common_cap summarises the first).
TRUNCATION_CODES: frozenset[str] = frozenset(c.code for c in REGISTRY.values() if c.truncation)


def codes_in(*scopes: Scope) -> tuple[str, ...]:
    """The codes of the given scopes, in registry order."""
    return tuple(c.code for c in REGISTRY.values() if c.scope in scopes)


@dataclass(frozen=True)
class Finding:
    """One judgement about a request (request_id set) or a whole variant (request_id None), under a
    registered code; rules build it with Finding.of so the registry sets the severity."""

    code: str
    severity: Severity
    message: str
    evidence: JSONMapping = field(default_factory=dict)
    request_id: str | None = None

    @classmethod
    def of(
        cls,
        code: str,
        message: str,
        evidence: JSONMapping,
        request_id: str | None = None,
        *,
        severity: Severity | None = None,
    ) -> Finding:
        """A finding of a registered code, at the registry's severity unless the rule picks another
        one the registry allows: the registry, not each rule, says how bad a code is."""
        entry = REGISTRY[code]
        if severity is None:
            severity = entry.severity
        elif severity not in entry.severities:
            raise ValueError(f"{code} is registered as {'/'.join(entry.severities)}, not {severity}")
        return cls(code, severity, message, evidence, request_id)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Finding:
        """Inverse of to_json (compare.json's findings are re-scored after they are written)."""
        return cls(**{**data, "severity": Severity(data["severity"])})

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
