"""The side-request client (side/client.py) against the simulator and tests/faultserver.py: what
each endpoint gives back, and that every way a request can fail leaves as one error class with a
one-line message. Also: the capture hot path imports nothing of aiohttp."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from simkit import sim_server

from itlaudit.errors import (
    ServerAnswerError,
    ServerStatusError,
    ServerTimeout,
    ServerUnreachableError,
)
from itlaudit.model.access import Access
from itlaudit.serve.sim import SIM_VERSION, SimConfig
from itlaudit.side.client import BlockingSideClient, SideClient

HOT_PATH = ("http1", "transport", "workers", "stamping", "sse", "chunk")


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    with sim_server(SimConfig(model="sim-tiny")) as url:
        yield url


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    message = str(exc.value)
    assert message and "\n" not in message
    return message


async def test_identity_version_metrics_and_dev_endpoints_of_the_simulator(sim_url: str) -> None:
    async with SideClient() as client:
        assert list(await client.models(sim_url)) == ["sim-tiny"]
        assert await client.version(sim_url) == SIM_VERSION
        assert "vllm:" in await client.metrics_text(sim_url)
        assert await client.ready(sim_url + "/")
        # The simulator has neither dev endpoint: a reset is an answer to note, /tokenize a refusal.
        assert (await client.reset_prefix_cache(sim_url)).status == 404
        with pytest.raises(ServerStatusError) as exc:
            await client.tokenize(sim_url, {"model": "sim-tiny", "prompt": "The quick brown fox"})
    assert exc.value.status == 404
    assert _one_line(exc) == f"POST {sim_url}/tokenize answered HTTP 404: 404: Not Found"


async def test_tokenize_reads_the_count_and_an_answer_without_one_is_one_line() -> None:
    """vLLM's /tokenize answer decodes into TokenizeAnswer (what else it sends is left unread); one
    without an integer count is ServerAnswerError naming the endpoint, not a KeyError downstream."""
    answers: list[dict[str, object]] = [
        {"count": 4, "max_model_len": 64, "tokens": [5, 6, 7, 8], "token_strs": None},
        {"tokens": [5]},
        {"count": True},
    ]

    async def tokenize(request: web.Request) -> web.Response:
        return web.json_response(answers.pop(0))

    app = web.Application()
    app.router.add_post("/tokenize", tokenize)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    url = f"http://127.0.0.1:{server.port}"
    body = {"model": "toy", "prompt": "The quick brown fox"}
    try:
        async with SideClient() as client:
            assert (await client.tokenize(url, body)).count == 4
            for _ in range(2):
                with pytest.raises(ServerAnswerError) as exc:
                    await client.tokenize(url, body)
                assert _one_line(exc).startswith(f"POST {url}/tokenize did not answer with a token count")
    finally:
        await server.close()


async def test_refused_is_unreachable_naming_the_url_and_what_to_check() -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    async with SideClient() as client:
        with pytest.raises(ServerUnreachableError) as exc:
            await client.get_json(url + "/v1/models")
        assert not await client.ready(url)
    assert type(exc.value) is ServerUnreachableError
    message = _one_line(exc)
    assert message.startswith(f"cannot reach {url}/v1/models (")
    assert message.endswith("check that the server is running and that the URL is right")


async def test_a_server_that_never_answers_is_a_timeout() -> None:
    with socket.socket() as listener:  # accepts connections (the kernel's backlog) and never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/version"
        async with SideClient(timeout_s=0.3) as client:
            with pytest.raises(ServerTimeout) as exc:
                await client.get_json(url)
    assert _one_line(exc).startswith(f"GET {url}: no complete answer within 0.3 s")


async def test_a_body_that_is_not_json_is_an_answer_error(sim_url: str) -> None:
    async with SideClient() as client:
        with pytest.raises(ServerAnswerError) as exc:
            await client.get_json(sim_url + "/metrics")  # Prometheus text, not JSON
    assert _one_line(exc).startswith(f"GET {sim_url}/metrics answered with a body that is not JSON")


def test_401_is_a_status_error_keeping_the_answer(faultserver: Callable[..., str]) -> None:
    """auth_echo refuses a non-streaming completion with 401 and serves the rest."""
    url = faultserver("auth_echo")
    client = BlockingSideClient(Access((("Authorization", "Bearer sk-side-test"),)))
    with pytest.raises(ServerStatusError) as exc:
        body = {"model": "sim-tiny", "prompt": "Say hello to the world.", "max_tokens": 1}
        client.request("POST", url + "/v1/completions", body=body, timeout_s=10).checked()
    assert exc.value.status == 401 and "application/json" in exc.value.headers["content-type"]
    assert _one_line(exc).startswith(f"POST {url}/v1/completions answered HTTP 401: Unauthorized")
    assert client.ready(url) and client.version(url) == SIM_VERSION


def test_the_blocking_facade_reads_json_and_says_not_ready(sim_url: str) -> None:
    client = BlockingSideClient()
    assert client.get_json(sim_url + "/v1/models")["data"][0]["id"] == "sim-tiny"
    assert client.ready(sim_url)
    assert not client.ready(f"http://127.0.0.1:{_free_port()}", timeout_s=1)


def test_credentials_in_a_url_are_masked_in_the_message() -> None:
    url = f"http://user:hunter2@127.0.0.1:{_free_port()}/v1/models"
    with pytest.raises(ServerUnreachableError) as exc:
        BlockingSideClient().get_json(url)
    assert "hunter2" not in _one_line(exc)


def test_the_capture_hot_path_imports_no_aiohttp() -> None:
    """The streams have their own transport; aiohttp (the side requests' stack) must not ride along."""
    modules = ", ".join(f"itlaudit.capture.{name}" for name in HOT_PATH)
    code = f"import sys, {modules}; print('aiohttp' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
