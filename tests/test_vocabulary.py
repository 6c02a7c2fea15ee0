"""The shared vocabulary (model/vocabulary.py, model/launch.py, model/records.Status): one enum per
concept whose members are the strings run folders always held, so an old folder reads into the same
members and a new one writes the same bytes; and the typed compare, sweep and bisect results, read
from the previous format of compare.json, sweep.json and bisect.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from itlaudit.analysis.comparison import CompareResult
from itlaudit.analysis.sweep import SweepResult
from itlaudit.bisect import state as state_mod
from itlaudit.bisect.build_range import Build
from itlaudit.bisect.settings import Settings
from itlaudit.bisect.state import BisectResult, State
from itlaudit.errors import BisectError, LaunchError, SweepError
from itlaudit.model.launch import LaunchKind, LaunchSpec
from itlaudit.model.records import RequestRecord, Status
from itlaudit.model.vocabulary import Endpoint, LoadAxis, Shift, StampMode, Verdict

FIXTURE = Path(__file__).parent / "fixtures" / "runfolder-v1" / "requests.jsonl"


def test_an_old_folders_records_read_into_members_and_write_back_the_same_strings() -> None:
    lines = [json.loads(line) for line in FIXTURE.read_text(encoding="utf-8").splitlines()]
    records = [RequestRecord.from_json(line) for line in lines]
    assert {type(r.status) for r in records} == {Status}
    assert {r.stamp for r in records} == {StampMode.KERNEL}
    assert {r.endpoint for r in records} == {Endpoint.COMPLETIONS}
    for line, record in zip(lines, records, strict=True):
        again = json.loads(json.dumps(record.to_json()))
        assert {k: again[k] for k in ("status", "stamp", "endpoint")} == {
            k: line[k] for k in ("status", "stamp", "endpoint")
        }


def test_every_enum_is_its_string() -> None:
    assert [str(e) for e in Endpoint] == ["completions", "chat", "generate"]
    assert Endpoint.CHAT.path == "/v1/chat/completions" and Endpoint.COMPLETIONS.path == "/v1/completions"
    assert Endpoint.GENERATE.path == "/generate"
    assert [str(m) for m in StampMode] == ["kernel", "loop"]
    assert [str(a) for a in LoadAxis] == ["concurrency", "rate"]
    assert [str(k) for k in LaunchKind] == ["python", "sglang", "docker", "command", "url"]
    assert [str(v) for v in Verdict] == ["good", "bad", "skip", "unknown"]
    assert StampMode("loop") is StampMode.LOOP and json.dumps(LoadAxis.RATE) == '"rate"'


def test_a_metric_shift_reads_as_a_judges_answer_in_one_place() -> None:
    assert {s: s.regressed for s in Shift} == {
        Shift.BETTER: False,
        Shift.WORSE: True,
        Shift.SAME: False,
        Shift.UNKNOWN: None,
    }
    assert [Verdict.of(p) for p in (True, False, None)] == [Verdict.BAD, Verdict.GOOD, Verdict.UNKNOWN]


def test_a_launch_kind_given_as_a_string_becomes_its_member_and_an_unknown_one_is_one_line() -> None:
    assert LaunchSpec(kind="docker", image="i").kind is LaunchKind.DOCKER  # type: ignore[arg-type]
    assert LaunchKind.DOCKER.needs == "image" and LaunchKind.PYTHON.needs == "python"
    assert LaunchKind.SGLANG.needs == "python"  # SGLang's interpreter, as vLLM's
    with pytest.raises(
        LaunchError, match=r"^launch kind 'k8s': use one of python, sglang, docker, command, url$"
    ):
        LaunchSpec(kind="k8s")  # type: ignore[arg-type]


def _bisect_json(tmp_path: Path, **result: object) -> Path:
    """A finished bisection of three builds as format 2 wrote it: `in_progress` null, no rounds."""
    shas = [c * 40 for c in "abc"]
    state = State(Settings(good=shas[0], bad=shas[-1]), [Build(s, "commit") for s in shas])
    data = state.to_json()
    probes = [(0, "good"), (2, "bad"), (1, "bad")]
    data.update(format=2, status="done", in_progress=None, **result)
    data["probes"] = [
        {
            "index": i,
            "build": shas[i],
            "verdict": v,
            "label": shas[i][:9],
            "reason": "r",
            "dir": str(tmp_path / f"p{i}"),
        }
        for i, v in probes
    ]
    (tmp_path / state_mod.STATE_FILE).write_text(json.dumps(data), encoding="utf-8")
    return tmp_path


def test_a_bisect_json_of_the_previous_format_reads_into_the_typed_result(tmp_path: Path) -> None:
    folder = _bisect_json(
        tmp_path, first_bad="b" * 40, last_good="a" * 40, candidates=["b" * 40], message="first bad build: b"
    )
    loaded = state_mod.load(folder)
    assert loaded.result == BisectResult(
        message="first bad build: b", first_bad="b" * 40, last_good="a" * 40, candidates=["b" * 40]
    )
    assert loaded.in_progress == []
    # Saved again, it is the current format with the same answer.
    loaded.save(folder)
    again = json.loads((folder / state_mod.STATE_FILE).read_text())
    assert again["format"] == state_mod.FORMAT and again["first_bad"] == "b" * 40


def test_a_bisect_result_of_the_wrong_shape_is_one_line(tmp_path: Path) -> None:
    folder = _bisect_json(tmp_path, candidates="b")
    with pytest.raises(BisectError, match="has a result that does not read"):
        state_mod.load(folder)


def _old_sweep() -> dict[str, object]:
    """sweep.json as the dict-building code wrote it before the typed result (format 1: no `format`)."""
    point = {"concurrency": 4, "requests": 8, "itl_ms": {"p50": 5.0, "p90": 6.0, "p99": 7.0}}
    crossed = {
        "variant": "K3",
        "base": "K0",
        "last_faster": 4,
        "first_slower": None,
        "factor_there": 2.0,
        "headline": "K3 is faster per token than K0 at every concurrency in range",
    }
    return {
        "scenario": "s",
        "axis": "concurrency",
        "grid": [4],
        "trials": 1,
        "goodput_slo": None,
        "variants": {"K0": [point], "K3": [point]},
        "crossovers": [crossed],
        "headline": [crossed["headline"]],
        "sla": {
            "terms": "tpot_p99_ms<=20",
            "precision": 1.0,
            "variants": {
                "K0": {
                    "probe": None,
                    "limit": 4,
                    "failed_at": None,
                    "above_range": True,
                    "point": point,
                    "words": "K0: highest concurrency 4",
                }
            },
        },
    }


def test_a_sweep_json_of_the_previous_format_reads_into_the_typed_result_and_writes_the_same_keys() -> None:
    old = _old_sweep()
    result = SweepResult.from_json(old)
    assert result.axis is LoadAxis.CONCURRENCY and result.crossovers[0].last_faster == 4
    assert result.sla is not None and result.sla.variants["K0"].limit == 4
    assert result.to_json() == old
    assert SweepResult.from_json({**old, "format": 2}) == result
    assert "sla" not in SweepResult.from_json({k: v for k, v in old.items() if k != "sla"}).to_json()


def test_a_sweep_json_of_the_wrong_shape_is_one_line() -> None:
    with pytest.raises(
        SweepError, match=r"^sweep.json does not read as a sweep \(.*axis.*\): .*rebuilds it$"
    ):
        SweepResult.from_json({**_old_sweep(), "axis": "tokens"})


OLD_COMPARE = Path(__file__).parent / "fixtures" / "vllm-0.24.0-cuda-h200-runs" / "k0k3-c1" / "compare.json"


def test_a_compare_json_of_the_previous_format_reads_into_the_typed_result() -> None:
    """An unversioned compare.json from before `not_comparable`, `stream_accepted_tokens` and
    `prefix_cache`: those read as unknown, everything it holds as it was."""
    old = json.loads(OLD_COMPARE.read_text(encoding="utf-8"))
    assert "format" not in old
    result = CompareResult.from_json(old)
    assert (
        result is not None
        and result.baseline == old["baseline"]
        and list(result.variants) == list(old["variants"])
    )
    for name, row in old["variants"].items():
        assert {k: v for k, v in result.to_json()["variants"][name].items() if k in row} == row, name
        assert result.variants[name].not_comparable is None and result.variants[name].prefix_cache is None
    assert result.findings == old["findings"]


def test_a_compare_json_cut_short_or_of_another_shape_reads_as_absent() -> None:
    assert CompareResult.from_json(None) is None
    assert CompareResult.from_json([]) is None
    assert (
        CompareResult.from_json(
            {"baseline": "K0", "variants": {"K0": {"itl_ms_p50": "fast"}}, "findings": []}
        )
        is None
    )
