"""Added lag and token-ITL error of `itlaudit run` against a paced SSE server in its own process.

Run: `.venv/bin/python benchmarks/paced_run_error.py --streams 16 64 [--itlaudit-path DIR] [-- RUN FLAGS]`.
The server (tests/paced_sse.py) sends one token per chunk every `--interval-ms` (absolute schedule) and
records when it wrote each chunk; for each chunk the added lag is (client stamp − first client stamp)
− (send time − first send time), and each request's token-ITL error is its derived itl_ms against the
ITL of its send times. `--itlaudit-path` runs another itlaudit tree (e.g. an older commit exported with
`git archive`) for a before/after. The paced server is plain asyncio, one sleep per chunk: at high loads
it lags its schedule, which does not matter here since lag and error are measured against what it sent.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def measure(streams: int, tokens: int, interval_ms: float, itlaudit_path: Path, flags: list[str]) -> str:
    work = Path(tempfile.mkdtemp(prefix="paced-run-"))
    port = free_port()
    log = work / "server.json"
    server = subprocess.Popen(
        [
            *(sys.executable, str(ROOT / "tests" / "paced_sse.py"), "--port", str(port)),
            *("--interval-ms", str(interval_ms), "--log", str(log)),
        ]
    )
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        prompts = ", ".join(f'"p{i}"' for i in range(streams))
        (work / "s.toml").write_text(
            f'name = "paced"\nendpoint = "completions"\n[workload]\nprompts = [{prompts}]\n'
            f"num_requests = {streams}\nconcurrency = {streams}\nmax_tokens = {tokens}\n"
            '[[variants]]\nname = "A"\n'
        )
        env = {**os.environ, "PYTHONPATH": str(itlaudit_path)}
        subprocess.run(
            [
                *(sys.executable, "-m", "itlaudit", "run", str(work / "s.toml")),
                *("--url", f"http://127.0.0.1:{port}", "--out", str(work / "run")),
                *("--ledger", str(work / "ledger.jsonl"), *flags),
            ],
            env=env,
            cwd=work,
            check=True,
            capture_output=True,
        )
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait()
    sent = {row["prompt"]: np.asarray(row["sent"]) * 1000 for row in json.loads(log.read_text())["finished"]}
    lags, errors = [], []
    for line in (work / "run" / "requests.jsonl").read_text().splitlines():
        record = json.loads(line)
        index = int(record["request_id"].rsplit("-", 1)[1])
        t = np.asarray(record["chunk_t_ms"][: len(sent[f"p{index}"])])
        s = sent[f"p{index}"][: len(t)]
        lags.append((t - t[0]) - (s - s[0]))
        true_itl = (s[-1] - s[0]) / (len(s) - 1)
        measured = (t[-1] - t[0]) / (len(t) - 1)
        errors.append(abs(measured / true_itl - 1))
    lag = np.concatenate(lags)
    return (
        f"{streams:4d} streams: added lag p50 {np.percentile(lag, 50):6.3f} "
        f"p99 {np.percentile(lag, 99):6.3f} max {lag.max():7.3f} ms; worst token-ITL error {max(errors):6.2%}"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--tokens", type=int, default=500)
    parser.add_argument("--interval-ms", type=float, default=2.0)
    parser.add_argument("--itlaudit-path", type=Path, default=ROOT)
    parser.add_argument("flags", nargs="*", help="extra `itlaudit run` flags (after --)")
    args = parser.parse_args()
    for streams in args.streams:
        print(measure(streams, args.tokens, args.interval_ms, args.itlaudit_path, args.flags), flush=True)


if __name__ == "__main__":
    main()
