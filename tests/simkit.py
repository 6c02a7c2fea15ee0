"""The simulator on a thread and the CLI in-process, for tests whose code under test runs its own
event loop (asyncio.run) and would pay ~5 s for a fresh interpreter per command."""

from __future__ import annotations

import asyncio
import io
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from unittest import mock

from aiohttp import web

from itlaudit.cli.app import main
from itlaudit.model.sendlog import SendLog
from itlaudit.serve.sim import SimConfig, make_app


@contextmanager
def sim_server(config: SimConfig, send_log: SendLog | None = None) -> Iterator[str]:
    """The simulator on its own thread and loop, for code under test that runs asyncio.run itself;
    `send_log` receives when each chunk was due and written (read it after the block)."""
    with app_on_thread(make_app(config, send_log)) as url:
        yield url


@contextmanager
def app_on_thread(app: web.Application) -> Iterator[str]:
    """Any aiohttp app (the simulator, a test proxy) on its own thread and loop, on a free port. It is
    cleaned up while its loop still runs, so a stream still open at the end is closed, not left hanging."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, access_log=None)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        loop.close()


def itlaudit(*args: str) -> subprocess.CompletedProcess[str]:
    """The real entry point (one-line errors, exit codes) in-process: a fresh interpreter costs ~5 s."""
    stdout, stderr = io.StringIO(), io.StringIO()
    code = 0
    with (
        mock.patch.object(sys, "argv", ["itlaudit", *args]),
        redirect_stdout(stdout),
        redirect_stderr(stderr),
    ):
        try:
            main()
        except SystemExit as exc:
            code = int(exc.code or 0)
    return subprocess.CompletedProcess(list(args), code, stdout.getvalue(), stderr.getvalue())
