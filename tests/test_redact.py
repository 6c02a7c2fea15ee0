"""The one redaction policy (itlaudit/model/redact.py): which names are secret, and that each writer masks."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from reportkit import stream

from itlaudit.analysis.derive import summarize_run
from itlaudit.model.codes import HTTP_ERROR, Finding
from itlaudit.model.records import Status
from itlaudit.model.redact import (
    MASK,
    is_secret_name,
    redact_args,
    redact_env,
    redact_json,
    redact_text,
    redact_url,
    secret_values,
)
from itlaudit.report.writer import write_reports


@pytest.mark.parametrize(
    "name",
    ["HF_TOKEN", "VLLM_API_KEY", "--api-key", "OPENAI_APIKEY", "AUTHORIZATION", "db_password", "MY_SECRET_X"],
)
def test_credential_names_are_secret(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name", ["--max-num-batched-tokens", "--tokenizer", "TOKENIZERS_PARALLELISM", "max_tokens", "VLLM_USE_V1"]
)
def test_experiment_parameters_are_not(name: str) -> None:
    assert not is_secret_name(name)


def test_a_number_under_a_secret_looking_name_is_a_shape_not_a_key() -> None:
    """A model's config.json (meta.json's roofline) has num_key_value_heads and kv_lora_rank: numbers,
    kept; the same names' text is masked, as any credential-named text is."""
    config = {"num_key_value_heads": 8, "kv_lora_rank": 512, "api_key": "sk-abcdefgh", "auth": {"key": "x"}}
    assert redact_json(config) == {
        "num_key_value_heads": 8, "kv_lora_rank": 512, "api_key": MASK, "auth": {"key": MASK},
    }  # fmt: skip


def test_args_and_env_keep_names_and_lose_values() -> None:
    args = ["--model", "/m", "--api-key", "sk-1", "--api-key=sk-2", "-e", "HF_TOKEN=hf-3", "--port", "1"]
    assert redact_args(args) == [
        "--model",
        "/m",
        "--api-key",
        MASK,
        f"--api-key={MASK}",
        "-e",
        f"HF_TOKEN={MASK}",
        "--port",
        "1",
    ]
    assert redact_env({"HF_TOKEN": "x", "VLLM_USE_V1": "1"}) == {"HF_TOKEN": MASK, "VLLM_USE_V1": "1"}
    values = secret_values({"HF_TOKEN": "hf_abcdefgh"}, ["--api-key", "sk-longer-1", "--api-key=sk-longer-2"])
    assert values == {"hf_abcdefgh", "sk-longer-1", "sk-longer-2"}
    assert redact_text("key sk-longer-1 and hf_abcdefgh", values) == f"key {MASK} and {MASK}"


def test_a_server_message_echoing_our_credential_is_masked_in_the_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_API_KEY", "sk-echoed-by-the-server")
    failed = replace(
        stream("K0"), status=Status.HTTP_ERROR, http_status=401, error="bad key sk-echoed-by-the-server"
    )
    records = [failed, stream("K0", 1)]
    finding = Finding.of(HTTP_ERROR, failed.error, {}, failed.request_id)
    write_reports(tmp_path, "t", records, summarize_run(records), [finding])
    for name in ("report.md", "report.html"):
        text = (tmp_path / name).read_text()
        assert "sk-echoed-by-the-server" not in text and "bad key ***" in text


def test_header_secrets_are_the_credential_headers_and_their_bare_tokens() -> None:
    from itlaudit.model.redact import header_secret_values, redact_bytes

    headers = [
        ("Authorization", "Bearer sk-0123456789"),
        ("X-Api-Key", "k-9876543210"),
        ("X-Team", "team-a-long"),
    ]
    assert header_secret_values(headers) == {"Bearer sk-0123456789", "sk-0123456789", "k-9876543210"}
    line = b'{"error": "Incorrect API key provided: sk-0123456789"}'
    assert redact_bytes(line, [b"sk-0123456789"]) == b'{"error": "Incorrect API key provided: ***"}'


def test_launch_secret_values_cover_the_inherited_env_the_launch_env_and_the_args() -> None:
    from itlaudit.model.launch import LaunchSpec
    from itlaudit.model.redact import launch_secret_values

    launch = LaunchSpec(
        "command", command=["vllm", "serve", "--api-key", "sk-from-args"], env={"HF_TOKEN": "hf_launchenv"}
    )
    found = launch_secret_values(launch, {"OPENAI_API_KEY": "sk-inherited", "HOME": "/root"})
    assert found == {"sk-from-args", "hf_launchenv", "sk-inherited"}
    assert launch_secret_values(None, {"OPENAI_API_KEY": "sk-inherited"}) == set()


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        ("http://user:sekritPW@127.0.0.1:18600/v1", "http://user:***@127.0.0.1:18600/v1"),
        ("error from https://ghp_token123@github.com/x: 404", "error from https://***@github.com/x: 404"),
        ("two: http://a:b@h1 and ws://c:d@h2/p", "two: http://a:***@h1 and ws://c:***@h2/p"),
    ],
)
def test_url_userinfo_is_masked_in_text_args_and_json(given: str, kept: str) -> None:
    assert redact_url(given) == redact_text(given, []) == kept
    assert redact_args(["--url", given]) == ["--url", kept]
    assert redact_json({"build": {"url": given}, "cmd": [given]}) == {"build": {"url": kept}, "cmd": [kept]}


@pytest.mark.parametrize(
    "text", ["http://127.0.0.1:8000/v1", "mail a@b.example", "http://host/path@v2?x=a@b", "user:pw@host"]
)
def test_text_without_url_userinfo_is_unchanged(text: str) -> None:
    assert redact_url(text) == redact_text(text, []) == text
