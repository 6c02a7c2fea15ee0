"""One folder for every provider's builds, kept under a size limit by evicting the least recently used.

A vLLM venv is 3-8 GB, so a 600-commit bisection cannot keep them all, but rerunning a bisection (or
resuming one) should not reinstall the builds it already has: mozregression's persistent download
cache with a size limit. An entry counts only once its marker is written after a successful install,
so a crash mid-install leaves a folder that is wiped and redone, never trusted.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypedDict

MARKER = ".itlaudit-build.json"
_SIZE_UNITS = {"": 1, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


class BuildInfo(TypedDict, total=False):
    """What a provider keeps about a prepared build: its cache marker's JSON form (each provider sets
    its own keys; the cache adds provider, key and last_used)."""

    provider: str
    key: str
    last_used: float
    python: str  # pip, wheels: the venv's interpreter
    version: str | None
    image: str  # docker
    docker: str
    external_bytes: int  # disk the entry uses outside its folder (the image)
    url: str  # wheels: the WheelChoice installed
    filename: str
    variant: str
    platform_tag: str
    argv: list[str]  # command: the server command line (not cached)


# Called with an evicted entry's marker data: lets a provider free what lives outside the folder
# (a docker image in the engine's storage).
Releaser = Callable[[BuildInfo], None]


def parse_size(text: str) -> int:
    """`20G`, `500M`, `0` (no limit) or plain bytes; the unit is what users type for disk sizes."""
    value = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = value[-1:] if value[-1:] in _SIZE_UNITS else ""
    number = value[: len(value) - len(unit)]
    try:
        size = float(number)
    except ValueError:
        raise ValueError(f"cannot read size {text!r}; use e.g. 40G, 500M or 0 for no limit") from None
    if size < 0:
        raise ValueError(f"size {text!r} is negative")
    return int(size * _SIZE_UNITS[unit])


def _du(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


class BuildCache:
    """Entries are `<root>/<provider>/<key>/`; the marker holds what the provider needs to reuse it."""

    def __init__(self, root: Path, limit_bytes: int, releasers: dict[str, Releaser] | None = None) -> None:
        self.root = root
        self.limit_bytes = limit_bytes
        self._releasers = releasers or {}
        self._pinned: set[Path] = set()
        self._lock = threading.Lock()

    def path(self, provider: str, key: str) -> Path:
        return self.root / provider / key

    def lookup(self, provider: str, key: str) -> BuildInfo | None:
        """The marker data of a complete entry (and mark it used), or None."""
        marker = self.path(provider, key) / MARKER
        try:
            data: BuildInfo = json.loads(marker.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        data["last_used"] = time.time()
        marker.write_text(json.dumps(data) + "\n", encoding="utf-8")
        return data

    def fresh(self, provider: str, key: str) -> Path:
        """An empty folder for a new install, wiping any half-finished one."""
        path = self.path(provider, key)
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        return path

    def complete(self, provider: str, key: str, data: BuildInfo) -> BuildInfo:
        data = {**data, "provider": provider, "key": key, "last_used": time.time()}
        (self.path(provider, key) / MARKER).write_text(json.dumps(data) + "\n", encoding="utf-8")
        return data

    @contextmanager
    def pinned(self, provider: str, key: str) -> Iterator[Path]:
        """Protect an entry from eviction while it is being installed or served from."""
        path = self.path(provider, key)
        with self._lock:
            self._pinned.add(path)
        try:
            yield path
        finally:
            with self._lock:
                self._pinned.discard(path)

    def entries(self) -> list[tuple[Path, BuildInfo, int]]:
        """(path, marker data, size) of every entry; unfinished ones get last_used 0 so they go first."""
        found: list[tuple[Path, BuildInfo, int]] = []
        if not self.root.is_dir():
            return found
        for provider_dir in sorted(p for p in self.root.iterdir() if p.is_dir()):
            for entry in sorted(p for p in provider_dir.iterdir() if p.is_dir()):
                try:
                    data: BuildInfo = json.loads((entry / MARKER).read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    data = {"provider": provider_dir.name, "last_used": 0}
                found.append((entry, data, _du(entry) + int(data.get("external_bytes", 0))))
        return found

    def evict(self) -> list[Path]:
        """Delete least recently used entries until the total fits; pinned ones are never touched.
        A limit of 0 means unlimited."""
        if self.limit_bytes <= 0:
            return []
        entries = sorted(self.entries(), key=lambda e: float(e[1].get("last_used", 0)))
        total = sum(size for _p, _d, size in entries)
        removed: list[Path] = []
        for path, data, size in entries:
            if total <= self.limit_bytes:
                break
            with self._lock:
                if path in self._pinned:
                    continue
            release = self._releasers.get(str(data.get("provider")))
            if release is not None and "key" in data:
                release(data)
            shutil.rmtree(path, ignore_errors=True)
            total -= size
            removed.append(path)
        return removed
