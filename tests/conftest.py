"""Shared pytest setup: real-vLLM tests opt-in, and the fixtures more than one test module uses.

Where shared test code lives: fixtures here; plain helpers in helper modules that are not test modules
(reportkit, simkit, pacedkit, faultkit, vllm_server, gemmakit, fixtures/bisect/helpers). A test module imports
neither another test module nor this file (tests/test_layering.py checks it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from faultkit import launch_faultserver
from gemmakit import gemma, release_gemma  # noqa: F401  (gemma registered here: one server per variant)
from pacedkit import Paced
from vllm_server import POOL


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--vllm",
        action="store_true",
        default=False,
        help="run tests marked vllm (installs the vLLM CPU testbed on first use; minutes per module)",
    )


def _vllm_selected(config: pytest.Config) -> bool:
    markexpr = config.getoption("markexpr") or ""
    return bool(config.getoption("--vllm")) or ("vllm" in markexpr and "not vllm" not in markexpr)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    users = [item for item in items if "gemma" in getattr(item, "fixturenames", ())]
    config.stash[_LAST_GEMMA_USER] = users[-1].nodeid if users else None
    if _vllm_selected(config):
        return
    skip = pytest.mark.skip(reason="real vLLM test: run with --vllm or -m vllm")
    for item in items:
        if "vllm" in item.keywords:
            item.add_marker(skip)


_LAST_GEMMA_USER = pytest.StashKey[str | None]()


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A Gemma server (~7 GB) does not start beside the pooled testbed servers (vllm_server.POOL)."""
    if "gemma" in getattr(item, "fixturenames", ()):
        POOL.release()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    POOL.release()


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """The Gemma servers (~7 GB each) stop after the last test that uses them, not at the session's end:
    the vLLM tests after it need that memory on a 24 GB machine."""
    if item.nodeid == item.config.stash.get(_LAST_GEMMA_USER, None):
        release_gemma()


@pytest.fixture()
def paced(tmp_path: Path) -> Iterator[Callable[..., Paced]]:
    """Start paced SSE servers (each in its own process); every one still running is killed after."""
    servers: list[Paced] = []

    def start(
        interval_ms: float = 2.0, fault: str = "none", fault_after: int = 3, extra: tuple[str, ...] = ()
    ) -> Paced:
        servers.append(Paced(tmp_path, interval_ms, fault, fault_after, extra))
        return servers[-1]

    yield start
    for server in servers:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()


@pytest.fixture()
def faultserver(tmp_path: Path) -> Iterator[Callable[..., str]]:
    """Factory: a tests/faultserver.py in MODE (extra flags after it) launched as a user's server would
    be; returns its URL, and every one started is stopped at the end of the test."""
    servers = []

    def start(mode: str, *flags: str) -> str:
        server = launch_faultserver(mode, *flags, log=tmp_path / f"fs{len(servers)}.log")
        servers.append(server)
        return server.url

    yield start
    for server in servers:
        server.stop()
