"""The shared vocabulary: the closed sets of names every stage speaks, each one enum defined once.

They live in model/ because every stage may import model/ and none may import upward: the scenario
parser, the capture, the analysis and bisect all name the same endpoint, stamp mode, load axis and
verdicts. Each is a StrEnum, so a member *is* its string: run-folder files (meta.json, requests.jsonl,
compare.json, sweep.json, bisect.json) keep the plain strings they always held, old folders read back
into the same members, and a comparison with a literal still holds while callers migrate.

The other two closed sets sit beside the data they describe: a request's outcome is
`model.records.Status`, a launch kind is `model.launch.LaunchKind`.
"""

from __future__ import annotations

from enum import StrEnum


class Endpoint(StrEnum):
    """The API a scenario streams from (its `endpoint` key): the OpenAI-style completions and chat
    completions, or SGLang's native `/generate` (cumulative text, `meta_info.completion_tokens` on every
    chunk: the token counts SGLang's own bench_serving spreads each gap over)."""

    COMPLETIONS = "completions"
    CHAT = "chat"
    GENERATE = "generate"

    @property
    def path(self) -> str:
        """The URL path the request is posted to."""
        return _ENDPOINT_PATHS[self]


_ENDPOINT_PATHS = {
    Endpoint.COMPLETIONS: "/v1/completions",
    Endpoint.CHAT: "/v1/chat/completions",
    Endpoint.GENERATE: "/generate",
}


class StampMode(StrEnum):
    """How chunk arrival times are taken: the socket's kernel receive time, or the event loop's clock
    when the read returns (the fallback wherever kernel stamps are unsupported)."""

    KERNEL = "kernel"
    LOOP = "loop"


# The one stamp default (--stamp, CaptureOptions, a lone stream_request): kernel, which falls back to
# loop where the platform has no kernel receive timestamps (a record's `stamp` says which ran).
DEFAULT_STAMP = StampMode.KERNEL


class QualityGate(StrEnum):
    """How output quality (the gibberish rule) gates a variant's figures (analysis.validity): against
    the baseline's outputs (a variant broken where its baseline is clean: seed 003's K3), on every
    variant whatever its baseline writes (the old rule, which vetoes every dummy-weight server), or
    never. Truncation and failed requests gate under all three."""

    RELATIVE = "relative"
    STRICT = "strict"
    OFF = "off"


class LoadAxis(StrEnum):
    """What a sweep varies between points: streams in flight, or requests started per second."""

    CONCURRENCY = "concurrency"
    RATE = "rate"


class Shift(StrEnum):
    """How one metric moved from BASE to NEW (analysis.stats.compare_samples): diff's words and the
    `stats_verdict` a bisect probe records. Not a Verdict: a shift is about one metric, a verdict
    about one build; `regressed` is the one mapping between them."""

    BETTER = "better"
    WORSE = "worse"
    SAME = "same"
    UNKNOWN = "unknown"

    @property
    def regressed(self) -> bool | None:
        """The one reading of a change as a bisect judge's answer: worse is the problem present,
        same or better is absent, unknown cannot tell."""
        return None if self is Shift.UNKNOWN else self is Shift.WORSE


class Verdict(StrEnum):
    """A bisect probe's answer, as bisect.json and the report spell it."""

    GOOD = "good"
    BAD = "bad"
    SKIP = "skip"  # the build could not be had
    UNKNOWN = "unknown"  # it ran, but the rule could not tell

    @classmethod
    def of(cls, present: bool | None) -> Verdict:
        """A judge's answer (is the problem present?) as a verdict."""
        return cls.UNKNOWN if present is None else cls.BAD if present else cls.GOOD
