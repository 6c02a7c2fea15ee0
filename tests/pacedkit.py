"""The paced SSE server (tests/paced_sse.py, in its own process) and the `itlaudit run` subprocess
around it: shared by the capture and workload tests; the `paced` fixture is in conftest.py."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from itlaudit.serve.launcher import free_port
from itlaudit.store.jsonl import iter_jsonl

PACED = Path(__file__).parent / "paced_sse.py"


class Paced:
    """A running paced server; `stop()` ends it and returns its log (send times, arrivals)."""

    def __init__(
        self, tmp_path: Path, interval_ms: float, fault: str, fault_after: int, extra: tuple[str, ...] = ()
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp_path / f"paced-{self.port}.json"
        self.process = subprocess.Popen(
            [
                *(sys.executable, str(PACED), "--port", str(self.port), "--interval-ms", str(interval_ms)),
                *("--log", str(self.log), "--fault", fault, "--fault-after", str(fault_after)),
                *extra,
            ]
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError("paced server did not start") from None
                time.sleep(0.05)

    def stop(self) -> dict[str, Any]:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=20)
        return json.loads(self.log.read_text())


def scenario(tmp_path: Path, workload: str) -> Path:
    path = tmp_path / "s.toml"
    path.write_text(
        f'name = "t"\nendpoint = "completions"\n\n[workload]\n{workload}\n\n[[variants]]\nname = "A"\n',
        encoding="utf-8",
    )
    return path


def itlaudit(*args: str, cwd: Path, **popen: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "itlaudit", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
        **popen,
    )


def run(tmp_path: Path, url: str, workload: str, *flags: str) -> subprocess.CompletedProcess[str]:
    path = scenario(tmp_path, workload)
    return itlaudit("run", str(path), "--url", url, "--out", str(tmp_path / "run"), *flags, cwd=tmp_path)


def lines(tmp_path: Path, name: str = "requests.jsonl") -> list[dict[str, Any]]:
    return list(iter_jsonl(tmp_path / "run" / name))


def prompts(n: int) -> str:
    return "prompts = [" + ", ".join(f'"p{i}"' for i in range(n)) + "]"
