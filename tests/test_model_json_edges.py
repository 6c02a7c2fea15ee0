"""Where model/ meets free-form JSON and TOML (issue 24 item 3): what is narrowed as it is read is
checked, and a value of the wrong shape ends in one error naming it, not a TypeError later."""

from __future__ import annotations

from pathlib import Path

import pytest

from itlaudit.errors import RecordsError, ScenarioError
from itlaudit.model.datasets import jsonl_dataset
from itlaudit.model.jsonvalue import JSONObject
from itlaudit.model.scenario import parse_scenario
from itlaudit.model.sendlog import SEND_LOG_FORMAT, ResponseSends, SendLog

SCENARIO = """\
name = "edges"
model = "tiny"

[workload]
prompts = ["a sentence to send"]
max_tokens = 4
{extra}

[[variants]]
name = "A"
url = "http://127.0.0.1:8000"
{variant}
"""


def _scenario(extra: str = "", variant: str = "") -> object:
    return parse_scenario(SCENARIO.format(extra=extra, variant=variant), Path("s.toml"))


def test_extra_body_keeps_json_and_sends_a_toml_date_as_its_iso_text() -> None:
    sc = _scenario('extra_body = { top_k = 5, nested = { a = [1, 2.5, "x"] }, when = 1979-05-27T07:32:00Z }')
    body = sc.workload.extra_body  # type: ignore[attr-defined]
    assert body == {"top_k": 5, "nested": {"a": [1, 2.5, "x"]}, "when": "1979-05-27T07:32:00Z"}


def test_extra_body_that_is_not_a_table_is_named() -> None:
    with pytest.raises(ScenarioError, match=r"s\.toml:7: `workload\.extra_body` must be dict"):
        _scenario("extra_body = 3")


@pytest.mark.parametrize(
    ("variant", "message"),
    [
        ("headers = { X-Team = 7 }", "`variants.headers` 'X-Team'"),
        ('launch = { kind = "python", python = "/p", env = { A = 1 } }', "env` values must be strings"),
    ],
)
def test_headers_and_env_values_must_be_strings(variant: str, message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        _scenario(variant=variant)


def test_headers_and_env_read_as_strings() -> None:
    sc = _scenario(variant='headers = { X-Team = "audit" }')
    assert sc.variants[0].headers == {"X-Team": "audit"}  # type: ignore[attr-defined]


def test_jsonl_messages_with_a_non_object_fall_back_to_the_prompt(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(
        '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}\n'
        '{"messages": ["not a message"], "prompt": "plain prompt"}\n'
        '{"messages": [], "prompt": "empty messages"}\n',
        encoding="utf-8",
    )
    first, second, third = jsonl_dataset(path, chat=True).entries
    assert first.messages == [{"role": "user", "content": "hi"}] and first.prompt is None
    assert first.max_tokens == 3
    assert second.messages is None and second.prompt == "plain prompt"
    assert third.messages is None and third.prompt == "empty messages"


def test_send_log_round_trips_and_a_damaged_one_is_named() -> None:
    log = SendLog(
        server={"kind": "sim", "step_ms": 2.0}, responses={"r": ResponseSends([1, 2], [3, 4], [1, 2])}
    )
    assert SendLog.from_json(log.to_json()) == log
    damaged: JSONObject = {"format": SEND_LOG_FORMAT, "responses": {"r": {"due_ns": ["x"]}}}
    with pytest.raises(RecordsError, match=r"send log: `responses` holds a damaged entry .*due_ns"):
        SendLog.from_json(damaged)
    with pytest.raises(RecordsError, match="`server` must be an object"):
        SendLog.from_json({"format": SEND_LOG_FORMAT, "server": [1], "responses": {}})
