"""bisect.json: the bisection's whole memory, rewritten atomically after every step.

A probe is marked in progress (with its server's process group once one is up) before anything slow
happens, so a bisection killed at any point, even by SIGKILL, can be resumed: each marked probe (a
`--parallel` round has several) is rerun in a fresh folder (the partial one is kept, renamed), and a
server the dead run left behind is stopped. Each probe names its round: the probes of one round ran
at the same time.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from itlaudit.bisect.build_range import Build
from itlaudit.bisect.settings import Settings
from itlaudit.errors import BisectError

__all__ = ["FORMAT", "STATE_FILE", "State", "cmdline", "load", "set_aside", "stop_orphan"]

STATE_FILE = "bisect.json"
# 2: probes run every chosen variant; metrics are per variant. 3: `in_progress` is a list (a parallel
# round has several probes in flight) and probes carry their round; a format 2 file is read as well.
FORMAT = 3
_READABLE = (2, 3)


@dataclass
class State:
    settings: Settings
    builds: list[Build]
    probes: list[dict[str, Any]] = field(default_factory=list)
    in_progress: list[dict[str, Any]] = field(default_factory=list)
    status: str = "running"
    result: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "status": self.status,
            **self.result,
            "probes": self.probes,
            "in_progress": self.in_progress,
            "settings": self.settings.to_json(),
            "builds": [b.to_json() for b in self.builds],
        }

    @property
    def rounds(self) -> int:
        """Rounds so far: probes of one round share its number; a probe without one (format 2, one
        probe at a time) is a round of its own."""
        return len({p.get("round", -n) for n, p in enumerate(self.probes, 1)})

    def save(self, bisect_dir: Path) -> None:
        path = bisect_dir / STATE_FILE
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2, default=str) + "\n", encoding="utf-8")
        os.replace(tmp, path)


def load(bisect_dir: Path) -> State:
    path = bisect_dir / STATE_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BisectError(f"--resume {bisect_dir}: cannot read {STATE_FILE} ({exc})") from None
    if data.get("format") not in _READABLE:
        raise BisectError(
            f"{path}: unknown format {data.get('format')!r}; it was written by another itlaudit"
        )
    result_keys = ("first_bad", "last_good", "candidates", "message", "compare_url", "signals", "explanation")
    return State(
        settings=Settings.from_json(data["settings"]),
        builds=[Build.from_json(b) for b in data["builds"]],
        probes=data.get("probes", []),
        in_progress=_as_list(data.get("in_progress")),
        status=data.get("status", "running"),
        result={k: data[k] for k in result_keys if k in data},
    )


def _as_list(pending: list[dict[str, Any]] | dict[str, Any] | None) -> list[dict[str, Any]]:
    """Format 2 kept at most one probe in progress, as a dict or null."""
    if pending is None:
        return []
    return [pending] if isinstance(pending, dict) else list(pending)


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def stop_orphan(record: dict[str, Any]) -> bool:
    """Kill the server group a killed run left behind, but only if the pid still runs the argv we
    recorded: after a reboot or a long pause the pid may belong to someone else."""
    pgid, argv = record.get("server_pgid"), record.get("server_argv")
    if not pgid or not argv or cmdline(int(pgid))[: len(argv)] != argv:
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(int(pgid), signal.SIGKILL)
    return True


def set_aside(probe_dir: Path) -> Path | None:
    """Keep a cut-short probe's files under a new name (never lose data), freeing its folder."""
    if not probe_dir.exists():
        return None
    n = 1
    while probe_dir.with_name(f"{probe_dir.name}.interrupted-{n}").exists():
        n += 1
    target = probe_dir.with_name(f"{probe_dir.name}.interrupted-{n}")
    probe_dir.rename(target)
    return target
