"""Where a whole `itlaudit run`'s capture CPU goes, per stage, sampled across its process tree with py-spy.

`benchmarks/capture_cpu.py --stages` times the capture loop's stages one by one in a replay; this runs
the real thing instead: `client_fidelity.py`'s itlaudit client (coordinator, capture workers, their writer
threads, the /metrics sampler) against the truth server under `py-spy record --subprocesses`, and sorts
every sample taken during the capture into a stage by the frames on its stack. Samples of start-up
(imports, the forkserver), of derivation and of report writing are left out, and so are idle waits
(a queue or a poll with nothing to do: py-spy counts some of those as running). py-spy pauses each
process to sample it, so the shares are the point here, not the totals. Needs py-spy on PATH or in the
venv (`pip install py-spy`; it is not a dependency of itlaudit).

    .venv/bin/python benchmarks/capture_profile.py --streams 64 --tokens 500
"""

from __future__ import annotations

import argparse
import collections
import inspect
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from itlaudit.capture import client as capture_client
from itlaudit.serve.truth import TruthConfig
from itlaudit.workflows.selfcheck import truth_server

HERE = Path(__file__).resolve().parent
_LOOP_STAGE = "event loop (handles, tasks, futures)"


def _decode_line() -> str:
    """py-spy names a C call by the Python line that made it: the read loop's msgspec call, as a frame."""
    lines, first = inspect.getsourcelines(capture_client._read_stream)
    offset = next(i for i, line in enumerate(lines) if "chunk = decode(payload)" in line)
    return f"_read_stream (itlaudit/capture/client.py:{first + offset})"


def _has(*names: str) -> Callable[[str], bool]:
    return lambda frame: any(name in frame for name in names)


# Checked from the sampled frame up to the event loop's dispatch; the first frame that matches names the
# stage. A C call (recvmsg, msgspec's decode) shows as the Python frame that made it.
STAGES: list[tuple[str, Callable[[str], bool]]] = [
    ("socket read + kernel stamp", _has("KernelReader", "StampingProtocol")),
    ("HTTP chunked decode", _has("capture/chunked.py")),
    ("SSE framing", _has("capture/sse.py")),
    ("JSON decode (msgspec)", _has("capture/chunk.py", _decode_line())),
    ("HTTP head (h11), Stream.read, inbox wait", _has("capture/http1.py", "capture/stamping.py")),
    ("connect + request send (per request)", _has("capture/transport.py", "capture/workers.py")),
    ("record building (read loop)", _has("_read_stream")),
    ("stream set-up and end (per request)", _has("capture/client.py")),
    ("record writer: encode + pipe write", _has("store/jsonl.py", "model/records.py")),
    ("event loop poll (epoll_wait)", _has("_TimedSelector.select", "EpollSelector.select")),
    ("lag probe", _has("capture/lagprobe.py")),
    ("coordinator: records decoded after capture", _has("RecordLander.records")),
    ("/metrics sampler", _has("metrics_sampler.py", "server_metrics.py")),
    ("coordinator: records in, progress", _has("capture/runner.py")),
]


def _is_idle(frames: list[str]) -> bool:
    leaf = frames[-1] if frames else ""
    return any(wait in leaf for wait in ("RecordWriter._drain", "Condition.wait", "Event.wait"))


def _in_capture(frames: list[str], worker: bool) -> bool:
    if any("importlib" in frame for frame in frames) or _is_idle(frames):
        return False
    if any("RecordWriter._drain" in frame for frame in frames):
        return True
    if worker:
        return any("run_until_complete" in frame for frame in frames)
    return any(key in frame for frame in frames for key in ("_collect", "RecordLander", "Sampler"))


def stage_of(frames: list[str]) -> str:
    """The stage of one sampled stack (outermost frame first)."""
    for frame in reversed(frames):
        if "_run_once" in frame or "run_forever" in frame:
            break  # the loop's dispatch: nothing more specific lies above it
        for name, matches in STAGES:
            if matches(frame):
                return name
    if any("asyncio/" in frame or "selectors.py" in frame for frame in frames):
        return _LOOP_STAGE
    return "other"


def split(lines: Iterable[str]) -> collections.Counter[str]:
    """Samples per stage from py-spy's raw (collapsed) output: `frame;frame;... count` per line."""
    counts: collections.Counter[str] = collections.Counter()
    for line in lines:
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack:
            continue
        parts = stack.split(";")
        worker = sum(part.startswith("process ") for part in parts) >= 3  # client → forkserver → worker
        frames = [part for part in parts if not part.startswith(("process ", "thread "))]
        if _in_capture(frames, worker):
            counts[stage_of(frames)] += int(count)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=500)
    parser.add_argument("--chunks-per-s", type=float, default=500.0)
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    args = parser.parse_args()
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(py_spy).exists():
        parser.error("py-spy is not installed: pip install py-spy")
    with (
        tempfile.TemporaryDirectory() as tmp,
        truth_server(TruthConfig(args.chunks_per_s), Path(tmp)) as server,
    ):
        raw = Path(tmp) / "samples.txt"
        client = [sys.executable, str(HERE / "client_fidelity.py"), "--client", "itlaudit"]
        client += [server.url, str(args.streams), str(args.tokens), "profile", f"{tmp}/run"]
        record = [py_spy, "record", "--subprocesses", "-r", str(args.rate), "-f", "raw", "-o", str(raw)]
        subprocess.run([*record, "--", *client], check=True, stdout=subprocess.DEVNULL)
        counts = split(raw.read_text().splitlines())
    total = sum(counts.values())
    print(
        f"{args.streams} streams × {args.tokens} tokens at {args.chunks_per_s:g} chunks/s: "
        f"{total} samples in the capture"
    )
    for name, count in counts.most_common():
        print(f"  {count / total:6.1%}  {name}")


if __name__ == "__main__":
    main()
