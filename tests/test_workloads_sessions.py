"""Multi-turn sessions against the simulator, with every request's body and its arrival and end times
recorded at the server: each turn carries the conversation so far, follows its previous turn's reply
after the think time, a session stays on one capture worker, and the report breaks figures down by turn."""

from __future__ import annotations

import itertools
import json
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from simkit import app_on_thread, itlaudit

from itlaudit.errors import ScenarioError
from itlaudit.model.scenario import parse_scenario
from itlaudit.serve.sim import SimConfig, make_app
from itlaudit.store.jsonl import iter_jsonl

FIXTURE = Path(__file__).parent / "fixtures" / "workloads" / "multi_turn_sharegpt.json"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _logged_sim(seen: list[dict[str, Any]]) -> web.Application:
    """The simulator, each streamed request's messages and its start and end (monotonic) kept."""

    @web.middleware
    async def log(request: web.Request, handler: Handler) -> web.StreamResponse:
        body = await request.json() if request.method == "POST" and request.can_read_body else {}
        started = time.monotonic()
        response = await handler(request)
        if body.get("stream"):
            seen.append({"messages": body.get("messages"), "start": started, "end": time.monotonic()})
        return response

    app = make_app(SimConfig(step_ms=2.0, ttft_ms=5.0))
    app.middlewares.append(log)
    return app


def _scenario(tmp_path: Path, workload: str) -> Path:
    (tmp_path / "conv.json").write_bytes(FIXTURE.read_bytes())
    path = tmp_path / "s.toml"
    path.write_text(
        f'name = "t"\nendpoint = "chat"\n[workload]\n{workload}\n[[variants]]\nname = "A"\n', encoding="utf-8"
    )
    return path


def test_each_turn_carries_its_history_and_follows_the_last_reply_after_the_think_time(
    tmp_path: Path,
) -> None:
    seen: list[dict[str, Any]] = []
    workload = (
        'concurrency = 2\n[workload.dataset]\nkind = "multi_turn"\npath = "conv.json"\nthink_time_s = 0.3'
    )
    path = _scenario(tmp_path, workload)
    with app_on_thread(_logged_sim(seen)) as url:
        result = itlaudit("run", str(path), "--url", url, "--out", str(tmp_path / "run"), "--workers", "2")
    assert result.returncode == 0, result.stderr
    conversations = json.loads(FIXTURE.read_text())
    assert len(seen) == 6  # 3 + 2 + 1 turns
    # Turn 2 of the moon conversation: its first question, the recorded reply, then its second question.
    moon = [turn["value"] for turn in conversations[0]["conversations"]]
    turn2 = next(s for s in seen if s["messages"][-1]["content"] == moon[2])
    assert turn2["messages"] == [
        {"role": "user", "content": moon[0]},
        {"role": "assistant", "content": moon[1]},
        {"role": "user", "content": moon[2]},
    ]
    # The system line before the first question is skipped; every body starts at a user turn.
    assert all(s["messages"][0]["role"] == "user" and len(s["messages"]) % 2 == 1 for s in seen)
    # Within a session each turn starts after the previous turn's reply ended, plus the think time.
    by_first = {}
    for s in sorted(seen, key=lambda s: s["start"]):
        by_first.setdefault(s["messages"][0]["content"], []).append(s)
    for turns in by_first.values():
        assert [len(t["messages"]) for t in turns] == list(range(1, 2 * len(turns), 2))
        for before, after in itertools.pairwise(turns):
            assert after["start"] - before["end"] >= 0.29
    records = sorted(iter_jsonl(tmp_path / "run" / "requests.jsonl"), key=lambda r: r["request_id"])
    # Entries are session by session (3, 2 and 1 turns): each session's records came from one worker.
    sessions = [records[0:3], records[3:5], records[5:6]]
    assert [[r["category"] for r in session] for session in sessions] == [
        ["turn 1", "turn 2", "turn 3"],
        ["turn 1", "turn 2"],
        ["turn 1"],
    ]
    assert all(len({r["worker"] for r in session}) == 1 for session in sessions)
    assert len({r["worker"] for r in records}) == 2
    categories = json.loads((tmp_path / "run" / "summary.json").read_text())["variants"]["A"]["categories"]
    assert {name: row["requests"] for name, row in categories.items()} == {
        "turn 1": 3,
        "turn 2": 2,
        "turn 3": 1,
    }


def test_a_session_goes_whole_to_one_worker() -> None:
    from itlaudit.capture.client import StreamOptions
    from itlaudit.capture.request_plan import plan_request
    from itlaudit.capture.workers import split_shares
    from itlaudit.model.records import RequestParams
    from itlaudit.model.vocabulary import StampMode

    def plan(index: int, session: int) -> Any:
        return plan_request(
            base_url="http://h",
            endpoint="chat",
            model="m",
            prompt=[{"role": "user", "content": "x"}],
            params=RequestParams(),
            request_id=f"A-{index:05d}",
            variant="A",
            session=session,
        )

    plans = [plan(i, session) for i, session in enumerate([0, 0, 0, 1, 1, 2, 3, 3])]
    shares = split_shares(plans, 4, StreamOptions(stamp=StampMode.LOOP), 2)
    assert [[p.request_id for p in share.plans] for share in shares] == [
        ["A-00000", "A-00001", "A-00002", "A-00005"],
        ["A-00003", "A-00004", "A-00006", "A-00007"],
    ]


@pytest.mark.parametrize(
    ("endpoint", "workload", "message"),
    [
        ("completions", "", 'set endpoint = "chat"'),
        ("chat", "request_rate = 2\n", "cannot pace multi_turn sessions"),
        ("chat", "", "think_time_s` must be"),
    ],
)
def test_bad_multi_turn_input_is_one_line(tmp_path: Path, endpoint: str, workload: str, message: str) -> None:
    (tmp_path / "conv.json").write_bytes(FIXTURE.read_bytes())
    think = "think_time_s = -1\n" if "think" in message else ""
    text = (
        f'name = "t"\nendpoint = "{endpoint}"\n[workload]\n{workload}[workload.dataset]\n'
        f'kind = "multi_turn"\npath = "conv.json"\n{think}[[variants]]\nname = "A"\n'
    )
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(text, tmp_path / "s.toml")
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_rate_sweep_refuses_sessions_and_paces_a_trace_at_each_rate(tmp_path: Path) -> None:
    from itlaudit.model.vocabulary import LoadAxis
    from itlaudit.workflows.sweep import point_scenario

    path = _scenario(tmp_path, '[workload.dataset]\nkind = "multi_turn"\npath = "conv.json"')
    result = itlaudit("sweep", str(path), "--url", "http://127.0.0.1:9", "--rate", "1,2")
    assert result.returncode == 2 and "--rate cannot pace multi_turn sessions" in result.stderr
    trace = tmp_path / "t.toml"
    shutil.copy(FIXTURE.parent / "mooncake.jsonl", tmp_path / "mooncake.jsonl")
    trace.write_text(
        'name = "t"\n[workload]\n[workload.dataset]\nkind = "trace"\npath = "mooncake.jsonl"\n'
        '[[variants]]\nname = "A"\n'
    )
    point = point_scenario(parse_scenario(trace.read_text(), trace), LoadAxis.RATE, 4.0, "A")
    arrivals = point.workload.arrivals
    assert arrivals.trace_s is None and arrivals.request_rate == 4.0  # the point's rate, not the trace's
