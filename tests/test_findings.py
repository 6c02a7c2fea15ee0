"""Each finding: one record that makes it fire (with its evidence) and a clean look-alike that does not."""

from __future__ import annotations

import json

import pytest

from itlaudit.analysis.findings import (
    CODES,
    COMMON_CAP_MIN_REQUESTS,
    Finding,
    request_findings,
    run_findings,
)
from itlaudit.analysis.metrics import request_metrics
from itlaudit.model.records import ChunkSeries, RequestParams, RequestRecord, Status

IDS = [11, 12, 13, 14]


def chunks(ids: list[int] = IDS, *, usage: bool = True, with_ids: bool = True) -> ChunkSeries:
    """One token per chunk, 10 ms apart, then the usage-only final chunk."""
    n = len(ids)
    return ChunkSeries(
        t_ms=[10.0 * (i + 1) for i in range(n + 1)],
        completion_tokens=[*(list(range(1, n + 1)) if usage else [None] * n), n],
        text_len=[1] * n + [0],
        has_choice=[True] * n + [False],
        token_ids=[*([[tok] for tok in ids] if with_ids else [None] * n), None],
    )


def record(
    *,
    max_tokens: int | None = 4,
    min_tokens: int | None = None,
    ignore_eos: bool = False,
    stop_token_ids: tuple[int, ...] = (),
    **kwargs: object,
) -> RequestRecord:
    """A clean completion that ran to max_tokens; keyword overrides make it dirty."""
    series = kwargs.pop("chunks", None) or chunks()
    base: dict = {
        "request_id": "r0",
        "variant": "k0",
        "endpoint": "/v1/completions",
        "url": "http://localhost:8000/v1/completions",
        "model": "tiny",
        "params": RequestParams(max_tokens, min_tokens, ignore_eos, list(stop_token_ids)),
        "status": Status.OK,
        "finish_reason": "length",
        "completion_tokens": sum(1 for c in series.has_choice if c),
        "done_sentinel": True,
        "e2e_ms": 60.0,
        "chunks": series,
    }
    base.update(kwargs)
    return RequestRecord(**base)


def findings(rec: RequestRecord) -> list[Finding]:
    return request_findings(rec, request_metrics(rec))


def only(rec: RequestRecord, code: str) -> Finding:
    hits = [f for f in findings(rec) if f.code == code]
    assert len(hits) == 1, findings(rec)
    assert hits[0].request_id == rec.request_id
    json.dumps(hits[0].to_json())
    return hits[0]


def codes(rec: RequestRecord) -> set[str]:
    return {f.code for f in findings(rec)}


def test_clean_record_has_no_findings() -> None:
    assert findings(record()) == []


def test_codes_are_unique() -> None:
    assert len(set(CODES)) == len(CODES)


# --- truncated_below_max_tokens ------------------------------------------------------------------


def test_truncated_below_max_tokens_fires() -> None:
    f = only(record(max_tokens=512), "truncated_below_max_tokens")
    assert f.severity == "error"
    assert f.evidence["cap"] == 4
    assert f.evidence["max_tokens"] == 512
    assert "512" in f.message


def test_truncated_without_max_tokens_is_a_server_cap() -> None:
    f = only(record(max_tokens=None), "truncated_below_max_tokens")
    assert f.evidence["max_tokens"] is None
    assert f.evidence["request_set_max_tokens"] is False


@pytest.mark.parametrize(
    "rec",
    [
        record(max_tokens=4),
        record(max_tokens=512, finish_reason="stop"),
        # Only chunks were counted: under MTP that undercounts, so no truncation can be claimed.
        record(max_tokens=512, completion_tokens=None, chunks=chunks(usage=False, with_ids=False)),
    ],
    ids=["reached-max", "stopped", "count-unknown"],
)
def test_truncated_quiet(rec: RequestRecord) -> None:
    assert "truncated_below_max_tokens" not in codes(rec)


# --- ignore_eos_violated -------------------------------------------------------------------------


def test_ignore_eos_violated_fires() -> None:
    f = only(record(max_tokens=512, ignore_eos=True, finish_reason="stop"), "ignore_eos_violated")
    assert f.evidence["finish_reason"] == "stop"
    assert f.evidence["stop_reason"] is None
    assert f.evidence["completion_tokens"] == 4


def test_ignore_eos_quiet_when_stopped_by_requested_stop_id() -> None:
    rec = record(ignore_eos=True, stop_token_ids=(14,), finish_reason="stop", stop_reason=14)
    assert "ignore_eos_violated" not in codes(rec)
    assert "ignore_eos_violated" not in codes(record(ignore_eos=True))


# --- min_tokens_violated -------------------------------------------------------------------------


def test_min_tokens_violated_fires() -> None:
    f = only(record(max_tokens=512, min_tokens=10, finish_reason="stop"), "min_tokens_violated")
    assert f.evidence["min_tokens"] == 10
    assert f.evidence["completion_tokens"] == 4


def test_min_tokens_quiet() -> None:
    assert "min_tokens_violated" not in codes(record(min_tokens=4))
    failed = record(min_tokens=10, status=Status.CONNECTION_ERROR, error="reset", done_sentinel=False)
    assert "min_tokens_violated" not in codes(failed)


# --- stop_token_ids_ignored ----------------------------------------------------------------------


def test_stop_id_before_last_token_fires() -> None:
    rec = record(chunks=chunks([11, 99, 13, 14]), stop_token_ids=(99,), finish_reason="stop", stop_reason=99)
    f = only(rec, "stop_token_ids_ignored")
    assert f.evidence["position"] == 1
    assert f.evidence["token_id"] == 99
    assert f.evidence["returned_tokens"] == 4


def test_stop_id_as_last_token_of_length_finish_fires() -> None:
    f = only(record(chunks=chunks([11, 12, 13, 99]), stop_token_ids=(99,)), "stop_token_ids_ignored")
    assert f.evidence["position"] == 3


@pytest.mark.parametrize(
    "rec",
    [
        record(chunks=chunks([11, 12, 13, 99]), stop_token_ids=(99,), finish_reason="stop", stop_reason=99),
        record(chunks=chunks([11, 99, 13, 14]), stop_token_ids=(99,), min_tokens=2),
        record(chunks=chunks([11, 99, 13, 14], with_ids=False), stop_token_ids=(99,)),
    ],
    ids=["stop-is-last", "inside-min-tokens", "no-ids-returned"],
)
def test_stop_ids_quiet(rec: RequestRecord) -> None:
    assert "stop_token_ids_ignored" not in codes(rec)


# --- stop_reason_unexpected ----------------------------------------------------------------------


def test_stop_reason_not_requested_fires() -> None:
    rec = record(max_tokens=512, finish_reason="stop", stop_reason=7, stop_token_ids=(99,))
    f = only(rec, "stop_reason_unexpected")
    assert f.evidence == {"finish_reason": "stop", "stop_reason": 7, "stop_token_ids": [99]}


def test_stop_reason_with_length_finish_fires() -> None:
    f = only(record(stop_reason="###"), "stop_reason_unexpected")
    assert f.evidence["finish_reason"] == "length"
    assert f.evidence["stop_reason"] == "###"


def test_stop_reason_quiet() -> None:
    requested = record(finish_reason="stop", stop_reason=14, stop_token_ids=(14,))
    eos = record(max_tokens=512, finish_reason="stop", stop_reason=None)
    assert "stop_reason_unexpected" not in codes(requested) | codes(eos)


# --- usage_missing -------------------------------------------------------------------------------


def test_usage_missing_chunk_fallback_is_an_error() -> None:
    f = only(record(chunks=chunks(usage=False, with_ids=False)), "usage_missing")
    assert f.severity == "error"
    assert f.evidence["token_source"] == "chunks"
    assert f.evidence["content_chunks"] == 4
    assert "chunk-based" in f.message


def test_usage_missing_with_token_ids_is_a_warning() -> None:
    f = only(record(chunks=chunks(usage=False)), "usage_missing")
    assert f.severity == "warning"
    assert f.evidence["token_source"] == "token_ids"


def test_usage_missing_quiet() -> None:
    assert "usage_missing" not in codes(record())
    http = record(status=Status.HTTP_ERROR, chunks=ChunkSeries(), completion_tokens=None, finish_reason=None)
    assert "usage_missing" not in codes(http)


# --- usage_non_monotonic -------------------------------------------------------------------------


def test_usage_non_monotonic_fires() -> None:
    series = chunks()
    series.completion_tokens[:4] = [1, 2, 1, 3]
    f = only(record(chunks=series), "usage_non_monotonic")
    assert f.evidence == {"chunk_index": 2, "previous": 2, "value": 1, "decreases": 1}


def test_usage_non_monotonic_quiet_with_repeats() -> None:
    series = chunks()
    series.completion_tokens[:4] = [0, 2, 2, 3]  # role-like 0 and a finish-only repeat are fine
    assert "usage_non_monotonic" not in codes(record(chunks=series))


# --- transport: stream_error, no_done_sentinel, http_error, connection_error ---------------------


def test_stream_error_fires() -> None:
    rec = record(status=Status.STREAM_ERROR, error="engine dead", completion_tokens=3, finish_reason=None)
    f = only(rec, "stream_error")
    assert f.evidence["message"] == "engine dead"
    assert f.evidence["completion_tokens"] == 3
    assert "no_done_sentinel" not in codes(rec)


def test_no_done_sentinel_fires() -> None:
    f = only(record(done_sentinel=False), "no_done_sentinel")
    assert f.severity == "warning"
    assert f.evidence["status"] == "ok"
    failed = record(status=Status.STREAM_ERROR, error="x", done_sentinel=False, finish_reason=None)
    assert {"stream_error", "no_done_sentinel"} <= codes(failed)


def test_http_error_fires_alone() -> None:
    rec = record(
        status=Status.HTTP_ERROR,
        http_status=400,
        error="max_tokens is too large",
        chunks=ChunkSeries(),
        completion_tokens=None,
        finish_reason=None,
        done_sentinel=False,
    )
    f = only(rec, "http_error")
    assert f.evidence == {"http_status": 400, "message": "max_tokens is too large"}
    assert codes(rec) == {"http_error"}


def test_connection_error_fires() -> None:
    rec = record(
        status=Status.CONNECTION_ERROR, error="reset by peer", finish_reason=None, done_sentinel=False
    )
    f = only(rec, "connection_error")
    assert f.evidence["message"] == "reset by peer"
    assert f.evidence["content_chunks"] == 4
    assert codes(rec) == {"connection_error"}


def test_transport_codes_quiet_on_ok_stream() -> None:
    assert codes(record()).isdisjoint({"stream_error", "no_done_sentinel", "http_error", "connection_error"})


# --- run level: common_cap -----------------------------------------------------------------------


def capped(n: int, variant: str = "k3", cap: int = 128, max_tokens: int | None = 512) -> list[RequestRecord]:
    return [
        record(request_id=f"{variant}-{i}", variant=variant, max_tokens=max_tokens, completion_tokens=cap)
        for i in range(n)
    ]


def full(n: int, variant: str = "k3") -> list[RequestRecord]:
    return [
        record(request_id=f"{variant}-full-{i}", variant=variant, max_tokens=512, completion_tokens=512)
        for i in range(n)
    ]


def test_common_cap_fires_per_variant() -> None:
    out = run_findings(capped(4) + full(1) + full(3, variant="k0"))
    assert [f.code for f in out] == ["common_cap"]
    f = out[0]
    assert f.request_id is None
    assert f.evidence["variant"] == "k3"
    assert f.evidence["cap"] == 128
    assert f.evidence["requests_at_cap"] == 4
    assert f.evidence["finished_requests"] == 5
    assert f.evidence["share"] == pytest.approx(0.8)
    assert f.evidence["max_tokens"] == [512]
    assert "128" in f.message
    json.dumps(f.to_json())


def test_common_cap_without_max_tokens() -> None:
    (f,) = run_findings(capped(3, max_tokens=None))
    assert f.evidence["requests_without_max_tokens"] == 3
    assert f.evidence["max_tokens"] == []


@pytest.mark.parametrize(
    "records",
    [
        capped(COMMON_CAP_MIN_REQUESTS - 1),
        capped(3) + full(4),
        [*capped(1, cap=128), *capped(1, cap=129), *capped(1, cap=130)],
        capped(4, cap=512),
    ],
    ids=["too-few", "minority", "different-lengths", "reached-max"],
)
def test_common_cap_quiet(records: list[RequestRecord]) -> None:
    assert run_findings(records) == []


def _timed(times: list[float]) -> ChunkSeries:
    ids = list(range(20, 20 + len(times)))
    series = chunks(ids)
    series.t_ms[: len(times)] = times
    return series


def test_chunks_coalesced_fires_on_bursts() -> None:
    # 8 content chunks in two reads of 4: 6 of the 7 gaps are zero, a real starved-server pattern.
    times = [10.0, 10.0, 10.0, 10.0, 50.0, 50.0, 50.0, 50.0]
    rec = record(max_tokens=8, chunks=_timed(times), loop_lag_p99_ms=0.05, e2e_ms=60.0)
    found = only(rec, "chunks_coalesced")
    assert found.evidence["zero_gaps"] == 6 and found.evidence["gaps"] == 7
    assert found.evidence["largest_burst"] == 4
    assert "server or the network" in found.message


def test_chunks_coalesced_blames_a_busy_client() -> None:
    times = [10.0, 10.0, 10.0, 10.0, 50.0, 50.0, 50.0, 50.0]
    rec = record(max_tokens=8, chunks=_timed(times), loop_lag_p99_ms=3.0, loop_lag_max_ms=9.0, e2e_ms=60.0)
    assert "loop was saturated" in only(rec, "chunks_coalesced").message


def test_client_saturated_fires_when_loop_lag_passes_5_percent_of_token_itl() -> None:
    # 8 tokens over 70 ms: token ITL 10 ms, so the line is 0.5 ms of loop-lag p99.
    times = [10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0]
    rec = record(max_tokens=8, chunks=_timed(times), loop_lag_p99_ms=0.6, loop_lag_max_ms=4.0)
    found = only(rec, "client_saturated")
    assert found.severity == "warning"
    assert found.evidence["itl_ms"] == pytest.approx(10.0)
    assert found.evidence["share"] == pytest.approx(0.06)
    assert "more --workers or fewer concurrent streams" in found.message


@pytest.mark.parametrize("lag", [None, 0.0, 0.49])
def test_client_saturated_quiet_while_the_loop_keeps_up(lag: float | None) -> None:
    times = [10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0]
    rec = record(max_tokens=8, chunks=_timed(times), loop_lag_p99_ms=lag, loop_lag_max_ms=lag)
    assert "client_saturated" not in codes(rec)


def test_chunks_coalesced_quiet_on_spread_arrivals() -> None:
    # one shared read out of 7 gaps is below the 25% threshold
    times = [10.0, 20.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0]
    assert "chunks_coalesced" not in codes(record(max_tokens=8, chunks=_timed(times)))


def test_client_saturated_with_kernel_stamps_needs_lag_of_a_whole_token() -> None:
    # Kernel stamps do not move with the loop: 0.6 ms of lag on a 10 ms ITL leaves them right.
    times = [10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0]
    calm = record(max_tokens=8, chunks=_timed(times), loop_lag_p99_ms=0.6, stamp="kernel")
    assert "client_saturated" not in codes(calm)
    behind = record(
        max_tokens=8, chunks=_timed(times), loop_lag_p99_ms=12.0, loop_lag_max_ms=30.0, stamp="kernel"
    )
    assert only(behind, "client_saturated").evidence["threshold_share"] == 1.0


def test_stream_stalled_names_the_gap_and_the_tokens_before_it() -> None:
    times = [10.0, 20.0, 30.0]
    rec = record(
        max_tokens=8, chunks=_timed(times), status="timeout", timeout_limit="stall_timeout_s", e2e_ms=1030.0
    )
    rec.chunks.t_ms[:] = times + [times[-1]] * (len(rec.chunks) - len(times))
    found = only(rec, "stream_stalled")
    assert found.severity == "error"
    assert found.evidence["limit"] == "stall_timeout_s"
    assert found.evidence["gap_ms"] == pytest.approx(1000.0)
    assert "stall_timeout_s" in found.message


def test_rate_limited_carries_retry_after() -> None:
    rec = record(max_tokens=8, status="rate_limited", http_status=429, retry_after_s=2.0, error="slow down")
    found = only(rec, "rate_limited")
    assert found.severity == "warning"
    assert found.evidence["retry_after_s"] == 2.0 and "Retry-After 2 s" in found.message


def test_invalid_utf8_counts_the_chunks() -> None:
    found = only(record(max_tokens=8, invalid_utf8_chunks=2), "invalid_utf8")
    assert found.evidence["chunks"] == 2


@pytest.mark.parametrize("status", ["ok", "stream_error", "http_error"])
def test_timeout_and_rate_limit_findings_quiet_on_other_statuses(status: str) -> None:
    found = codes(record(max_tokens=8, status=status, http_status=500))
    assert not found & {"stream_stalled", "rate_limited", "invalid_utf8"}
