"""[workload.dataset] as pure functions: random lengths, JSONL and ShareGPT files, and the one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from itlaudit.capture.request_plan import build_body
from itlaudit.errors import ScenarioError
from itlaudit.model.records import RequestParams
from itlaudit.model.scenario import Scenario, parse_scenario


def load(tmp_path: Path, workload: str, endpoint: str = "completions") -> Scenario:
    text = f'name = "t"\nendpoint = "{endpoint}"\n[workload]\n{workload}\n[[variants]]\nname = "A"\n'
    return parse_scenario(text, tmp_path / "s.toml")


def test_random_prompts_are_token_ids_of_exactly_input_len_and_outputs_are_forced() -> None:
    scenario = load(
        Path("."),
        'num_requests = 5\nseed = 1\n[workload.dataset]\nkind = "random"\ninput_len = 12\noutput_len = 7',
    )
    entries = [scenario.entry_for(i) for i in range(5)]
    assert all(e is not None and isinstance(e.prompt, list) and len(e.prompt) == 12 for e in entries)
    assert all(e is not None and e.max_tokens == 7 and e.ignore_eos for e in entries)
    assert all(
        3 <= t < 256 for e in entries if e is not None and isinstance(e.prompt, list) for t in e.prompt
    )
    body = build_body("completions", "m", entries[0].prompt, RequestParams(max_tokens=7, ignore_eos=True))  # type: ignore[union-attr,arg-type]
    assert body["prompt"] == entries[0].prompt and body["max_tokens"] == 7 and body["ignore_eos"] is True  # type: ignore[union-attr]


def test_random_lengths_as_uniform_range_and_normal_are_drawn_from_the_seed() -> None:
    workload = (
        'num_requests = 400\nseed = 2\n[workload.dataset]\nkind = "random"\n'
        "input_len = { min = 4, max = 9 }\noutput_len = { mean = 50, std = 5 }"
    )
    first, again = load(Path("."), workload), load(Path("."), workload)
    inputs = [len(first.entry_for(i).prompt) for i in range(400)]  # type: ignore[union-attr,arg-type]
    outputs = [first.entry_for(i).max_tokens for i in range(400)]  # type: ignore[union-attr]
    assert set(inputs) == set(range(4, 10))
    assert 48 < sum(outputs) / 400 < 52  # type: ignore[arg-type]
    assert [again.entry_for(i) for i in range(400)] == [first.entry_for(i) for i in range(400)]


def test_jsonl_lines_carry_their_max_tokens_category_and_messages(tmp_path: Path) -> None:
    lines = [
        {"prompt": "Write a haiku.", "max_tokens": 9, "category": "chat"},
        {"messages": [{"role": "user", "content": "2+2?"}], "category": "math"},
    ]
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n", encoding="utf-8")
    scenario = load(
        tmp_path, 'num_requests = 3\n[workload.dataset]\nkind = "jsonl"\npath = "d.jsonl"', "chat"
    )
    first, second, third = (scenario.entry_for(i) for i in range(3))
    assert first is not None and first.max_tokens == 9 and first.category == "chat"
    assert second is not None and second.messages == lines[1]["messages"] and second.category == "math"
    assert third == first  # num_requests cycles through the lines
    body = build_body("chat", "m", second.messages, RequestParams())  # type: ignore[arg-type]
    assert body["messages"] == lines[1]["messages"]


def test_sharegpt_takes_the_first_human_turn_and_estimates_the_reply_length(tmp_path: Path) -> None:
    data = [
        {
            "conversations": [
                {"from": "gpt", "value": "hi"},
                {"from": "human", "value": "Tell me a story."},
                {"from": "gpt", "value": "x" * 400},
            ]
        },
        {"conversations": [{"from": "human", "value": "lonely"}]},
    ]
    (tmp_path / "sg.json").write_text(json.dumps(data), encoding="utf-8")
    scenario = load(tmp_path, '[workload.dataset]\nkind = "sharegpt"\npath = "sg.json"')
    assert scenario.workload.num_requests == 1
    entry = scenario.entry_for(0)
    assert entry is not None and entry.prompt == "Tell me a story." and entry.max_tokens == 100
    assert scenario.workload.dataset is not None and "4 characters per token" in (
        scenario.workload.dataset.warning or ""
    )


@pytest.mark.parametrize(
    ("workload", "files", "message"),
    [
        (
            '[workload.dataset]\nkind = "csv"',
            {},
            "`workload.dataset.kind` must be one of random, jsonl, sharegpt",
        ),
        (
            '[workload.dataset]\nkind = "random"\ninput_len = 3\noutput_len = 3',
            {},
            "`workload.num_requests` is missing",
        ),
        (
            'num_requests = 2\n[workload.dataset]\nkind = "random"\ninput_len = 0\noutput_len = 3',
            {},
            "`input_len` must be a positive integer",
        ),
        ('[workload.dataset]\nkind = "jsonl"\npath = "none.jsonl"', {}, "which does not exist"),
        (
            '[workload.dataset]\nkind = "jsonl"\npath = "d.jsonl"',
            {"d.jsonl": '{"prompt": "a"}\n{"text": "b"}\n'},
            "d.jsonl:2 needs a non-empty `prompt`",
        ),
        (
            '[workload.dataset]\nkind = "jsonl"\npath = "d.jsonl"',
            {"d.jsonl": '{"prompt": "a", "max_tokens": 0}\n'},
            "max_tokens must be a positive integer",
        ),
        (
            '[workload.dataset]\nkind = "jsonl"\npath = "d.jsonl"',
            {"d.jsonl": '{"messages": [{"role": "user", "content": "a"}]}\n'},
            'need endpoint = "chat"',
        ),
        ('prompts = ["a"]\n[workload.dataset]\nkind = "jsonl"\npath = "d.jsonl"', {}, "instead of `prompts`"),
    ],
)
def test_bad_datasets_are_one_line_naming_the_key(
    tmp_path: Path, workload: str, files: dict[str, str], message: str
) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    with pytest.raises(ScenarioError, match=message.replace("(", r"\(")) as err:
        load(tmp_path, workload)
    assert "\n" not in str(err.value)


def test_random_on_chat_says_why_not(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="token ids, which /v1/chat/completions does not take"):
        load(
            tmp_path,
            'num_requests = 2\n[workload.dataset]\nkind = "random"\ninput_len = 3\noutput_len = 3',
            "chat",
        )
