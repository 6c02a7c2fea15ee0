"""Gemma 3 270M servers on the vLLM CPU testbed, shared by every real-model test of a pytest session.

A Gemma server takes a minute or more to start and holds ~7 GB (8 GB with a draft model), so each
variant is started once per session, on first use, and stopped at the session's end; never more than
MAX_LIVE run at once (asking for a third stops the least recently used). The variants are the ones
itlaudit/data/gemma-greedy.toml ships (K0, ngram-K3, draft-K3), read from that file so the tests serve
exactly what a user's `itlaudit compare` serves. Usage::

    from gemmakit import GemmaServers, capture, gemma  # noqa: F401  (gemma is the session fixture)

    def test_something(gemma: GemmaServers) -> None:
        record = capture(gemma.url("K0"), "A sentence of prompt", RequestParams(max_tokens=32))

`dropping_proxy(url, fields)` puts a proxy in front of a real server that deletes those request fields
before forwarding: the same model and engine, made not to honour ignore_eos, min_tokens or
stop_token_ids, which is the firing case of the findings that check them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import ClientSession, ClientTimeout, web
from simkit import app_on_thread

from itlaudit.capture.client import stream_request
from itlaudit.capture.request_plan import plan_request
from itlaudit.model.records import RequestParams, RequestRecord
from itlaudit.model.scenario import load_scenario
from itlaudit.serve.launch_config import launch_spec
from itlaudit.serve.launcher import LaunchedServer, launch
from itlaudit.serve.testbed import build_real_model, default_real_model_dir, install

REPO = Path(__file__).resolve().parent.parent
GREEDY_SCENARIO = REPO / "itlaudit" / "data" / "gemma-greedy.toml"
SAMPLED_SCENARIO = REPO / "itlaudit" / "data" / "gemma-sampled.toml"
SERVED_MODEL = "gemma3-270m"
EOS_IDS = (1, 106)  # <eos>, <end_of_turn>: generation_config.json's eos_token_id
MAX_LIVE = 2  # ~7-8 GB each on a 24 GB machine shared with other work


class GemmaServers:
    """Lazily started Gemma servers by variant name (a [[variants]] name of gemma-greedy.toml)."""

    def __init__(self, log_dir: Path) -> None:
        self._log_dir = log_dir
        self._live: dict[str, LaunchedServer] = {}  # insertion order = least recently used first
        build_real_model(default_real_model_dir(), python=install())
        self._variants = {v.name: v for v in load_scenario(GREEDY_SCENARIO).variants}

    def url(self, name: str) -> str:
        """The base URL of variant `name`'s server, starting it (and stopping the oldest) if need be."""
        return self.urls(name)[0]

    def urls(self, *names: str) -> list[str]:
        """The base URLs of these variants' servers (at most MAX_LIVE), the oldest others stopped to
        make room. Each missing one is started here, on the calling thread, one after the other: a
        launched server dies with the thread that started it (PR_SET_PDEATHSIG follows the forking
        thread, not the process), so a start on a pool thread that then ends leaves no server."""
        assert len(set(names)) == len(names) <= MAX_LIVE, names
        kept = {name: self._live.pop(name) for name in names if name in self._live}
        missing = [name for name in names if name not in kept]
        while len(self._live) + len(kept) + len(missing) > MAX_LIVE:
            self._live.pop(next(iter(self._live))).stop()
        self._live.update(kept)
        for name in missing:
            self._live[name] = self._launch(name)
        for name in names:  # most recently used last
            self._live[name] = self._live.pop(name)
        return [self._live[name].url for name in names]

    def _launch(self, name: str) -> LaunchedServer:
        launch_config = self._variants[name].launch
        assert launch_config is not None, f"{name} has no [variants.launch] in {GREEDY_SCENARIO}"
        return launch(launch_spec(launch_config), self._log_dir / f"{name}.log")

    def close(self) -> None:
        while self._live:
            self._live.popitem()[1].stop()


_SHARED: list[GemmaServers] = []  # the one instance of this process


@pytest.fixture(scope="session")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GemmaServers]:
    """The session's servers. conftest registers this fixture; a module that imports it as well gets a
    fixture definition of its own, so the instance is kept here: one per process however many
    definitions ask, never a second set of servers."""
    if not _SHARED:
        _SHARED.append(GemmaServers(tmp_path_factory.mktemp("gemma")))
    try:
        yield _SHARED[0]
    finally:
        _SHARED[0].close()


def release_gemma() -> None:
    """Stop the session's servers now (conftest calls it after the last test that uses them); a later
    `url()` would start them again."""
    for servers in _SHARED:
        servers.close()


def capture(
    url: str, prompt: str, params: RequestParams, *, request_id: str = "r0", extra_body: dict | None = None
) -> RequestRecord:
    """One streamed /v1/completions request through itlaudit's own client: the record the audits read."""
    planned = plan_request(
        base_url=url,
        endpoint="completions",
        model=SERVED_MODEL,
        prompt=prompt,
        params=params,
        request_id=request_id,
        variant="K0",
        extra_body=extra_body,
    )
    return asyncio.run(stream_request(planned))


@contextlib.contextmanager
def dropping_proxy(upstream: str, fields: tuple[str, ...]) -> Iterator[str]:
    """A proxy to `upstream` that deletes `fields` from every JSON request body; yields its base URL.

    The response streams back as it comes, so stream timing and chunking stay the real server's.
    """

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if body and request.content_type == "application/json":
            payload = json.loads(body)
            for name in fields:
                payload.pop(name, None)
            body = json.dumps(payload).encode()
        async with (
            ClientSession(timeout=ClientTimeout(total=600)) as session,
            session.request(
                request.method,
                upstream.rstrip("/") + request.path_qs,
                data=body,
                headers={"Content-Type": request.content_type} if body else None,
            ) as reply,
        ):
            out = web.StreamResponse(status=reply.status)
            out.content_type = reply.content_type
            await out.prepare(request)
            async for piece in reply.content.iter_any():
                await out.write(piece)
            await out.write_eof()
            return out

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    with app_on_thread(app) as url:
        yield url
