"""The run folder's lock: a run holds it while it writes, so a reader (`report`, `diff`, `export`) and a
second run can tell a folder still being written from a finished one.

The lock is an flock(2) on DIR/run.lock, whose text names the holder (pid, host, start time) for the
messages. The kernel drops an flock when its process ends, however it ends (SIGKILL, the OOM killer), so
a lock file a dead run left behind is recognised as stale by trying the lock, never by trusting the
file. Where the file system cannot lock at all (ENOLCK on an NFS mount without lockd), the run goes on
unlocked and readers fall back to asking whether the named pid is alive on this host.

The holder removes the file before it lets go; a process that opened the old file meanwhile finds,
once it has the lock, that the path no longer names what it locked, and starts over on a fresh file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from itlaudit.errors import RunDirError

LOCK_FILE = "run.lock"
# A reader holds its shared lock for microseconds while it checks: a run that finds the lock taken
# retries this long before it believes another run holds it.
ACQUIRE_WAIT_S = 2.0
_RETRY_S = 0.02


@dataclass(frozen=True)
class Holder:
    """Who holds (or held) a run folder's lock, as its lock file says; pid None while the holder has
    taken the lock but not yet written its name."""

    pid: int | None = None
    host: str | None = None
    started_at_unix: float | None = None

    def describe(self) -> str:
        """'a run (pid 123)', or on another host 'a run (pid 123 on gpu-7)'."""
        if self.pid is None:
            return "a run"
        where = f" on {self.host}" if self.host and self.host != socket.gethostname() else ""
        return f"a run (pid {self.pid}{where})"

    def alive_here(self) -> bool:
        """The holder's pid is a live process on this host: the judge when no lock can be taken."""
        if self.pid is None or self.host != socket.gethostname():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True  # alive, another user's
        return True


def _read_holder(fd: int) -> Holder:
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return Holder()
    if not isinstance(data, dict):
        return Holder()
    pid, host, started = data.get("pid"), data.get("host"), data.get("started_at_unix")
    return Holder(
        pid=pid if isinstance(pid, int) else None,
        host=host if isinstance(host, str) else None,
        started_at_unix=float(started) if isinstance(started, int | float) else None,
    )


def live_holder(run_dir: Path) -> Holder | None:
    """The run writing `run_dir` now, or None: no lock file, or one whose run has ended (stale)."""
    try:
        fd = os.open(run_dir / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return None  # no lock file (or none this user may read): nobody announced a run here
    try:
        holder = _read_holder(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return holder
        except OSError:
            return holder if holder.alive_here() else None
        return None  # the lock was free: whoever wrote the file is gone
    finally:
        os.close(fd)  # also lets go of the shared lock, if taken


def _busy(what: str, holder: Holder) -> RunDirError:
    return RunDirError(
        f"{what}: {holder.describe()} is still writing it; wait for it to end, or choose another folder"
    )


def _unwritable(what: str, path: Path, exc: OSError) -> RunDirError:
    return RunDirError(
        f"{what}: cannot write {path}: {exc.strerror or exc}; free space or choose another folder"
    )


def refuse_if_live(run_dir: Path, what: str) -> None:
    """One line, before anything is written, when a run is writing `run_dir` now."""
    holder = live_holder(run_dir)
    if holder is not None:
        raise _busy(what, holder)


@contextlib.contextmanager
def hold_run_lock(run_dir: Path, what: str) -> Iterator[None]:
    """Hold `run_dir`'s lock for the block; another live run there is refused with one line
    (`what` names the folder as the user gave it: '--out DIR')."""
    path = run_dir / LOCK_FILE
    deadline = time.monotonic() + ACQUIRE_WAIT_S
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise _unwritable(what, path, exc) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            if time.monotonic() < deadline:
                time.sleep(_RETRY_S)
                continue
            raise _busy(what, holder) from None
        except OSError as exc:
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                os.close(fd)
                raise
            holder = _read_holder(fd)  # no locks on this file system: the pid in the file decides
            if holder.alive_here() and holder.pid != os.getpid():
                os.close(fd)
                raise _busy(what, holder) from None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)  # the file was removed by its last holder after we opened it: start over
    try:
        record = {"pid": os.getpid(), "host": socket.gethostname(), "started_at_unix": time.time()}
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        except OSError as exc:
            raise _unwritable(what, path, exc) from None
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        os.close(fd)
