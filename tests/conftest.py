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


# Under pytest-xdist (`scripts/test -n 2 --dist loadgroup`) each of these groups runs on one worker,
# one test after another, while the other worker takes the rest: the real-engine tests
# share one session pool of testbed servers (vllm_server.POOL) and the Gemma servers, and need the
# machine's memory to themselves (~7 GB a Gemma server); the heavy ones start a Ray cluster, PostgreSQL,
# chromium or pip installs, or run the long simulated histories. A test joins its group by its marker
# alone, so a new test that starts a vLLM server is kept apart by the `vllm` marker it needs anyway.
GROUPS = {"vllm": "engine", "heavy": "heavy"}


@pytest.hookimpl(tryfirst=True)  # before xdist names each item's group in its node id
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    users = [item for item in items if "gemma" in getattr(item, "fixturenames", ())]
    if users:
        users[-1].stash[_LAST_GEMMA_USER] = True
    for item in items:
        group = next((GROUPS[m] for m in GROUPS if item.get_closest_marker(m)), None)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    if _vllm_selected(config):
        return
    skip = pytest.mark.skip(reason="real vLLM test: run with --vllm or -m vllm")
    for item in items:
        if "vllm" in item.keywords:
            item.add_marker(skip)


_LAST_GEMMA_USER = pytest.StashKey[bool]()


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A Gemma server (~7 GB) does not start beside the pooled testbed servers (vllm_server.POOL)."""
    if "gemma" in getattr(item, "fixturenames", ()):
        POOL.release()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    POOL.release()


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """The Gemma servers (~7 GB each) stop after the last test that uses them, not at the session's end:
    the vLLM tests after it need that memory on a 24 GB machine."""
    if item.stash.get(_LAST_GEMMA_USER, False):
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
