"""Helpers for the Ray tests (tests/test_cluster_ray*.py): the capture actors a run's meta.json names,
and a fault injected into actor 1 mid-run, once every stream is open."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def actors(run_dir: Path, variant: str = "truth") -> list[dict[str, Any]]:
    """The capture actors meta.json names for the variant (node, host, pid, clock offset, ...)."""
    meta = json.loads((run_dir / "meta.json").read_text())
    found: list[dict[str, Any]] = meta["variants"][variant]["workers"]
    return found


def on_second_actor(
    run_dir: Path, action: Callable[[dict[str, Any]], Any], *, settle_s: float, timeout_s: float
) -> tuple[threading.Thread, list[Any]]:
    """Start a thread that waits for meta.json to name two actors, waits `settle_s` (every stream open,
    none finished), then calls `action` on actor 1's entry. Returns the thread (join it after the run)
    and the list the action's result lands in: empty when the actors were never named in time."""
    results: list[Any] = []

    def watch() -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                named = actors(run_dir)
            except (OSError, KeyError, ValueError):
                named = []
            if len(named) == 2:
                time.sleep(settle_s)
                results.append(action(named[1]))
                return
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread, results
