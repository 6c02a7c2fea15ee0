"""Issue 39 item 2, bounded by construction: whatever a server or a file sends, itlaudit's memory and
time stay bounded, and a limit that is reached is one line (or a record's stream_error), never a hang,
a traceback or lost data. Rows R3-R6 of docs/faults.md; each firing case beside a clean neighbour."""

from __future__ import annotations

import json
import time
import timeit
from collections.abc import Callable
from pathlib import Path

import pytest

from itlaudit.capture.sse import MAX_EVENT_BYTES, SSEFramer
from itlaudit.errors import EventTooLarge
from itlaudit.model.datasets import MAX_DRAWN_TOKENS, multi_turn_dataset, trace_dataset
from itlaudit.telemetry.metrics_sampler import MAX_PAGE_BYTES
from itlaudit.telemetry.window import Telemetry
from tests.faultkit import itlaudit, refused_before_any_folder, url_variant, write_scenario

MIB = 1 << 20
PAGE_LIMIT = f"more than {MAX_PAGE_BYTES // MIB} MiB"


def run(tmp_path: Path, url: str, workload: str, *flags: str) -> tuple[list[dict], dict, str]:
    """`itlaudit run` of one variant at `url`: its records, meta.json and terminal; exit 0 asserted."""
    tmp_path.mkdir(exist_ok=True)
    path = write_scenario(tmp_path, url_variant("A", url), workload)
    result = itlaudit("run", str(path), "--out", str(tmp_path / "run"), *flags, cwd=tmp_path)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    records = [json.loads(line) for line in (tmp_path / "run" / "requests.jsonl").read_text().splitlines()]
    return records, json.loads((tmp_path / "run" / "meta.json").read_text()), result.stdout + result.stderr


# --- R3: the stream reader's event limit, linear buffering -----------------------------------------


@pytest.mark.fault_row("R3")
def test_an_endless_event_line_ends_at_the_limit_as_a_stream_error_and_is_kept(
    faultserver: Callable[..., str], tmp_path: Path
) -> None:
    """Was: an event-stream body with no newline ran forever, growing, and an interrupt kept no record.
    Now each stream is cut at MAX_EVENT_BYTES (64 MiB, ~0.5 s off loopback) as a stream_error
    naming the limit, with the two events before it kept. ~4-6 s."""
    workload = 'prompts = ["hi"]\nnum_requests = 2\nconcurrency = 2\nmax_tokens = 12'
    started = time.monotonic()
    records, _, _ = run(tmp_path, faultserver("endless_line"), workload)
    assert time.monotonic() - started < 60
    assert len(records) == 2
    for record in records:
        assert record["status"] == "stream_error"
        assert f"over the reader's {MAX_EVENT_BYTES // MIB} MiB event limit" in record["error"]
        assert record["text"] == " a1 a2" and len(record["chunk_t_ms"]) == 2
    assert (tmp_path / "run" / "report.md").exists()


@pytest.mark.fault_row("R3")
def test_an_event_is_framed_in_linear_time_and_kept_up_to_the_limit() -> None:
    """Was: every read re-joined and re-scanned the whole unfinished event (a 50 MB event: 39 s to
    capture; 40 MB here took ~13 s). Now 40 MB in 64 KiB reads is framed in well under a second, an
    event of exactly the limit is kept and one byte more is EventTooLarge naming it. ~0.4 s."""
    piece = b"x" * (64 * 1024)

    def forty_mb() -> list[bytes]:
        feed = SSEFramer().feed
        feed(b"data: ")
        for _ in range(640):
            feed(piece)
        return feed(b"\n\n")

    assert len(forty_mb()[0]) == 640 * len(piece)
    assert timeit.timeit(forty_mb, number=1) < 2.0

    limit = MIB
    at_limit = SSEFramer(limit)
    at_limit.feed(b"data: ")
    assert at_limit.feed(b"y" * (limit - len("data: "))) == []
    assert at_limit.feed(b"\n\n") == [b"y" * (limit - len("data: "))]
    over = SSEFramer(limit)
    over.feed(b"data: ")
    over.feed(b"y" * (limit - len("data: ")))
    with pytest.raises(EventTooLarge, match="over the reader's 1 MiB event limit"):
        over.feed(b"y")


# --- R4, R5: what a dataset builds up front ---------------------------------------------------------


def scenario_folder(tmp_path: Path) -> Path:
    """A folder of its own for the scenario, so that nothing but it is there to see (the data is not)."""
    folder = tmp_path / "scenario"
    folder.mkdir()
    return folder


def trace_file(tmp_path: Path, lines: int) -> Path:
    """A mooncake trace of `lines` short prompts, each with a hash id of its own."""
    path = tmp_path / "trace.jsonl"
    rows = [{"timestamp": i, "input_length": 100, "output_length": 8, "hash_ids": [i]} for i in range(lines)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.mark.fault_row("R4")
def test_a_trace_whose_hash_blocks_pass_the_token_limit_is_one_line(tmp_path: Path) -> None:
    """Was: block_tokens = 1000000 built 1M ids a line (200 lines: 1.6 GB) although each prompt is 100
    tokens: the limit counted only the prompts. Now every block counts, and the 21st line's block is
    refused in one line naming block_tokens. The trace's own block size (the neighbour) loads all 200
    lines. ~1-2 s."""
    path = trace_file(tmp_path, 200)
    workload = (
        f'num_requests = 200\n\n[workload.dataset]\nkind = "trace"\npath = "{path}"\nblock_tokens = 1000000'
    )
    line = refused_before_any_folder(scenario_folder(tmp_path), workload)
    assert "`workload.dataset.block_tokens`" in line and f"above the {MAX_DRAWN_TOKENS}" in line
    assert "each hash id is a block of block_tokens = 1000000 ids (mooncake traces use 512)" in line
    dataset = trace_dataset({"path": "trace.jsonl", "block_tokens": 512}, tmp_path, seed=0)
    assert len(dataset.entries) == 200 and all(len(e.prompt or ()) == 100 for e in dataset.entries)


def conversation_file(tmp_path: Path, turns: int) -> Path:
    """A ShareGPT file of one conversation of `turns` questions and replies."""
    lines = [{"from": ("human", "gpt")[i % 2], "value": f"line {i} of a long talk"} for i in range(2 * turns)]
    path = tmp_path / "talk.json"
    path.write_text(json.dumps([{"conversations": lines}]))
    return path


@pytest.mark.fault_row("R5")
def test_a_conversation_whose_histories_pass_the_token_limit_is_one_line(tmp_path: Path) -> None:
    """Was: one 3000-turn conversation (319 KB) took 2.9 GB: each turn copied every message before it.
    Now the turns share the message objects and their histories count against the prompt-token limit:
    a 3000-turn one is refused in one line naming max_turns, and max_turns = 500 (the neighbour) loads,
    each turn's history made of the same message objects. ~1-2 s."""
    path = conversation_file(tmp_path, 3000)
    workload = f'num_requests = 10\n\n[workload.dataset]\nkind = "multi_turn"\npath = "{path}"'
    line = refused_before_any_folder(scenario_folder(tmp_path), workload, endpoint="chat")
    assert "`workload.dataset.max_turns`" in line and f"above the {MAX_DRAWN_TOKENS}" in line
    assert "cut long conversations with max_turns" in line
    dataset = multi_turn_dataset({"path": str(path), "max_turns": 500}, tmp_path, chat=True)
    first, last = dataset.entries[0], dataset.entries[-1]
    assert len(dataset.entries) == 500 and last.messages is not None and first.messages is not None
    assert len(last.messages) == 999 and last.messages[0] is first.messages[0]


# --- R6: /metrics and DCGM pages ----------------------------------------------------------------------

WORKLOAD = 'prompts = ["hi"]\nnum_requests = 4\nconcurrency = 2\nmax_tokens = 12'
SAMPLERS = ("server_metrics", "gpu_telemetry")


@pytest.mark.fault_row("R6")
def test_a_50_mb_metrics_or_dcgm_page_is_one_line_and_the_run_goes_on(
    faultserver: Callable[..., str], tmp_path: Path
) -> None:
    """Was: a 50 MB /metrics or DCGM page made a 3.5 s run take 58 s (~20 s a scrape, parsed in the
    coordinator). Now a page is read to MAX_PAGE_BYTES at most: /metrics stating its 50 MB length is
    refused unread, the exporter's unstated one after 4 MiB; each sampler stops at once with one line,
    and every request is measured. The neighbour, the simulator's /metrics and the fixture exporter
    page, is sampled. ~10 s (two runs)."""
    pages = faultserver("big_pages")
    started = time.monotonic()
    records, meta, out = run(tmp_path / "big", pages, WORKLOAD, "--dcgm-url", f"{pages}/dcgm")
    assert time.monotonic() - started < 30
    assert len(records) == 4 and all(record["status"] == "ok" for record in records)
    said = [line for line in out.splitlines() if PAGE_LIMIT in line]
    assert (
        len(said) == 2 and any("/metrics" in line for line in said) and any("/dcgm" in line for line in said)
    )
    variant = meta["variants"]["A"]
    assert all(PAGE_LIMIT in variant[kind]["gave_up"] for kind in SAMPLERS)

    records, meta, out = run(
        tmp_path / "clean", faultserver("clean"), WORKLOAD, "--dcgm-url", f"{pages}/dcgm?after=1000"
    )
    assert PAGE_LIMIT not in out and all(record["status"] == "ok" for record in records)
    variant = meta["variants"]["A"]
    assert all(variant[kind]["rows"] >= 2 and variant[kind]["gave_up"] is None for kind in SAMPLERS)


@pytest.mark.fault_row("R6")
def test_a_page_that_grows_past_the_limit_mid_window_is_said_once(
    faultserver: Callable[..., str], tmp_path: Path
) -> None:
    """A page fine at the window's start and over the limit later: the sampler stops there, its rows
    before are kept, and the window says so once when it ends. ~1-3 s."""
    pages = faultserver("big_pages")
    said: list[str] = []
    window = Telemetry.from_flags(0.05, dcgm_url=f"{pages}/dcgm?after=1").window(
        "A", pages, tmp_path, say=said.append
    )
    window.start()
    time.sleep(0.3)
    recorded = window.stop()
    assert recorded["gpu_telemetry"]["rows"] == 1 and PAGE_LIMIT in recorded["gpu_telemetry"]["gave_up"]
    dcgm = [line for line in said if "/dcgm" in line]
    assert len(dcgm) == 1 and dcgm[0].endswith("; the run went on")
