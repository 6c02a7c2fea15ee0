"""The guards that outlive a crash: a server we started must die with us, or be reaped by the next run.

launcher.py's teardown covers success, failure, Ctrl-C and interpreter exit. SIGKILL runs none of
that, so two more guards live here: the kernel kills the server when itlaudit dies (PR_SET_PDEATHSIG,
Linux), and a pid file per server lets the next launch reap a group whose owner is gone (its
grandchildren, which PDEATHSIG does not reach, and any host without prctl).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import tempfile
from pathlib import Path

from itlaudit.model.stop import group_alive

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# Every launched server's environment names the itlaudit that started it: the reaper kills a group
# only when its leader carries its pid file's owner (a recycled pid is someone else's process).
OWNER_ENV = "ITLAUDIT_SERVER_OWNER"


def pid_dir() -> Path:
    """Per-user folder of pid files, one per live launched server."""
    return Path(tempfile.gettempdir()) / f"itlaudit-servers-{os.getuid()}"


def die_with_parent(owner: int) -> None:
    """preexec_fn of every launched server (`owner`: the pid of the itlaudit starting it, taken
    before the fork): SIGKILL it when that itlaudit dies, however it dies. The kernel sends the signal
    only for a death after the prctl; an owner killed between the fork and the prctl (a SIGKILL
    while a probe starts its server) left a server running with no pid file yet, adopted by init
    (tests/test_bisect_resume.py's kill test left one), so the child checks its parent after the
    prctl and exits at once if it is already someone else. Best effort: without Linux's prctl the
    pid file still lets the next run reap it."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != owner:
        os._exit(1)


def write_pid_file(pgid: int, docker_name: str | None) -> Path:
    folder = pid_dir()
    folder.mkdir(mode=0o700, exist_ok=True)
    path = folder / f"{pgid}.json"
    path.write_text(json.dumps({"pgid": pgid, "owner": os.getpid(), "docker_name": docker_name}))
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _started_by(pid: int, owner: int) -> bool:
    """A recycled pid must not be killed: the group leader must carry its owner's tag (OWNER_ENV,
    which the launcher sets for every server, whichever command started it) in its environment."""
    try:
        return f"{OWNER_ENV}={owner}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def reap_orphans() -> list[int]:
    """Kill the process groups (and containers) of launched servers whose itlaudit is gone; returns
    the groups killed. Called before every launch."""
    reaped = []
    for path in sorted(pid_dir().glob("*.json")):
        try:
            entry = json.loads(path.read_text())
            pgid, owner = int(entry["pgid"]), int(entry["owner"])
        except (OSError, ValueError, KeyError, TypeError):
            path.unlink(missing_ok=True)
            continue
        if _alive(owner):
            continue
        if group_alive(pgid) and _started_by(pgid, owner):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
            reaped.append(pgid)
        if entry.get("docker_name"):
            remove_container(str(entry["docker_name"]))
        path.unlink(missing_ok=True)
    return reaped


def remove_container(name: str) -> None:
    subprocess.run(
        ["docker", "rm", "-f", name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False
    )
