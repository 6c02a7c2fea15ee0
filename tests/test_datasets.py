"""[workload.dataset] as pure functions: random lengths, JSONL and ShareGPT files, and the one-line errors;
and a random dataset on chat, made text by a (toy) server tokenizer."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from itlaudit.capture.request_plan import build_body
from itlaudit.capture.tokenizer import ChatPrompts, random_chat_prompts
from itlaudit.errors import ScenarioError, ServerRejectedError
from itlaudit.model.datasets import chat_prompt_note, refit_ids, refit_rng, usable_text
from itlaudit.model.records import RequestParams
from itlaudit.model.scenario import Scenario, parse_scenario
from itlaudit.side.client import SideClient


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


def test_random_prefix_len_puts_one_shared_prefix_before_each_prompt_and_zero_changes_nothing() -> None:
    """vllm bench's --random-prefix-len: prefix_len + input_len tokens, the prefix the same in every
    prompt, the rest drawn apart; prefix_len 0 draws exactly what a table without it draws."""
    table = 'num_requests = 4\nseed = 3\n[workload.dataset]\nkind = "random"\ninput_len = 6\noutput_len = 2'
    plain = [load(Path("."), table).entry_for(i).prompt for i in range(4)]  # type: ignore[union-attr]
    prefixed = [load(Path("."), table + "\nprefix_len = 5").entry_for(i).prompt for i in range(4)]  # type: ignore[union-attr]
    assert all(len(p) == 11 for p in prefixed) and len({tuple(p[:5]) for p in prefixed}) == 1
    assert len({tuple(p[5:]) for p in prefixed}) == 4 and len({tuple(p[:5]) for p in plain}) == 4
    assert [load(Path("."), table + "\nprefix_len = 0").entry_for(i).prompt for i in range(4)] == plain  # type: ignore[union-attr]


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


def test_refit_cuts_a_long_reencoding_and_tops_up_a_short_one_from_the_entrys_own_seed() -> None:
    assert refit_ids([5, 6, 7, 8], 3, refit_rng(1, 0), 256) == [5, 6, 7]
    topped = refit_ids([5, 6], 6, refit_rng(1, 0), 256)
    assert topped[:2] == [5, 6] and len(topped) == 6 and all(3 <= t < 256 for t in topped)
    assert topped == refit_ids([5, 6], 6, refit_rng(1, 0), 256) != refit_ids([5, 6], 6, refit_rng(1, 1), 256)
    assert usable_text("a\ufffdb\ufffd") == "ab"


# A toy server tokenizer with the two ways a decoded text fails to re-encode to its length: "ab"
# merges into one token, and an id above 200 is a stray byte that decodes to U+FFFD, which encodes
# back as three such bytes. Its chat template adds three tokens.
STRAY = 201


def toy_decode(ids: list[int]) -> str:
    return "".join("\ufffd" if t >= STRAY else chr(ord("a") + t % 26) for t in ids)


def toy_encode(text: str) -> list[int]:
    ids, i = [], 0
    while i < len(text):
        if text.startswith("ab", i):
            ids.append(300)
            i += 2
            continue
        ids += [STRAY, STRAY + 1, STRAY + 2] if text[i] == "\ufffd" else [ord(text[i]) - ord("a") + 26]
        i += 1
    return ids


@contextlib.asynccontextmanager
async def toy_tokenizer_server(calls: list[str], *, missing: bool = False) -> AsyncIterator[str]:
    async def tokenize(request: web.Request) -> web.Response:
        calls.append("tokenize")
        body = await request.json()
        if "messages" in body:
            return web.json_response({"tokens": [1, 2, *toy_encode(body["messages"][0]["content"]), 4]})
        return web.json_response({"tokens": toy_encode(body["prompt"])})

    async def detokenize(request: web.Request) -> web.Response:
        calls.append("detokenize")
        return web.json_response({"prompt": toy_decode((await request.json())["tokens"])})

    app = web.Application()
    if not missing:
        app.router.add_post("/tokenize", tokenize)
        app.router.add_post("/detokenize", detokenize)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        await server.close()


def chat_random(count: int, input_len: str = "{ min = 5, max = 40 }") -> Scenario:
    return load(
        Path("."),
        f'num_requests = {count}\nseed = 3\n[workload.dataset]\nkind = "random"\ninput_len = {input_len}\n'
        "output_len = 4\nvocab_size = 220",
        "chat",
    )


async def chat_prompts(scenario: Scenario, calls: list[str], *, missing: bool = False) -> ChatPrompts | None:
    async with toy_tokenizer_server(calls, missing=missing) as url, SideClient() as client:
        return await random_chat_prompts(client, url, "m", scenario)


def test_random_on_chat_becomes_messages_of_exactly_input_len_server_tokens() -> None:
    scenario = chat_random(30)
    ids = [scenario.entry_for(i).prompt for i in range(30)]  # type: ignore[union-attr]
    assert all(isinstance(p, list) for p in ids)  # parsed as on completions: the ids are drawn up front
    merges = sum(len(toy_encode(toy_decode(p))) != len(p) for p in ids)  # type: ignore[arg-type]
    assert merges > 10  # else the round trips below would have nothing to correct
    calls: list[str] = []
    fitted = asyncio.run(chat_prompts(scenario, calls))
    assert fitted is not None
    lens = [len(p) for p in ids]  # type: ignore[arg-type]
    assert fitted.input_lens == lens and fitted.content_tokens == lens
    assert fitted.prompt_tokens == [n + 3 for n in lens]  # what the template adds, counted by the server
    entries = [fitted.scenario.entry_for(i) for i in range(30)]
    texts = [e.messages[0]["content"] for e in entries if e is not None and e.messages]
    assert [len(toy_encode(t)) for t in texts] == lens and not any("\ufffd" in t for t in texts)
    assert all(e is not None and e.prompt is None and e.max_tokens == 4 and e.ignore_eos for e in entries)
    assert calls.count("detokenize") > 30  # some entries needed more than one round trip
    assert "each message is exactly its input_len tokens" in fitted.note()
    assert "the chat template adds 3 tokens" in fitted.note()
    again = asyncio.run(chat_prompts(scenario, []))
    assert again is not None and again.scenario == fitted.scenario  # the seed fixes the texts


def test_random_on_chat_without_tokenize_is_one_line_saying_why() -> None:
    with pytest.raises(ServerRejectedError) as err:
        asyncio.run(chat_prompts(chat_random(2), [], missing=True))
    message = str(err.value)
    assert "needs the server's /tokenize and /detokenize" in message and "answered 404" in message
    assert 'endpoint = "completions"' in message and "\n" not in message


def test_other_workloads_need_no_tokenizer() -> None:
    completions = load(
        Path("."), 'num_requests = 2\n[workload.dataset]\nkind = "random"\ninput_len = 3\noutput_len = 3'
    )
    calls: list[str] = []
    assert asyncio.run(chat_prompts(completions, calls)) is None and calls == []


def test_chat_prompt_note_names_the_misses_and_the_template_range() -> None:
    note = chat_prompt_note([10, 12, 9], [10, 13, 9], [16, 20, 15])
    assert "1 of 3 messages missed their input_len" in note
    assert "the chat template adds 6-7 tokens" in note and "counts 15-20 prompt tokens" in note
