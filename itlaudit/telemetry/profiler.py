"""`--profile`: the server's profiler around the measured window (vLLM's POST /start_profile before
the first measured request, /stop_profile after the last), and where its trace went.

vLLM serves those endpoints only when started with a profiler config (`--profiler-config
'{"profiler": "torch", "torch_profiler_dir": DIR}'`); a server without them answers 404, which is one
line and no profile, never a failed run. A launched server's trace folder is read from its config.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict

from itlaudit.errors import ItlauditError
from itlaudit.model.access import NO_ACCESS, Access
from itlaudit.side.client import BlockingSideClient

# Stopping writes the trace, which takes a while on a long window: more than a side request's usual.
PROFILE_TIMEOUT_S = 300.0


def trace_dir(server_args: Sequence[str], env: dict[str, str]) -> str | None:
    """Where a launched vLLM writes its torch trace: --profiler-config's torch_profiler_dir (JSON, as
    `--profiler-config X` or `--profiler-config=X`), else the older VLLM_TORCH_PROFILER_DIR."""
    args = list(server_args)
    for i, arg in enumerate(args):
        value = None
        if arg == "--profiler-config" and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith("--profiler-config="):
            value = arg.partition("=")[2]
        if value is not None:
            try:
                config = json.loads(value)
            except ValueError:
                continue
            if isinstance(config, dict) and config.get("torch_profiler_dir"):
                return str(config["torch_profiler_dir"])
    return env.get("VLLM_TORCH_PROFILER_DIR") or None


class ProfileRecord(TypedDict):
    """meta.json's `profile` of a variant."""

    profiled: bool
    trace: str | None
    problem: str | None


@dataclass
class Profiler:
    """start() and stop() around the window; `problem` is the one line when the server has no
    profiler (then stop() does nothing)."""

    base_url: str
    access: Access = NO_ACCESS
    trace: str | None = None  # where the trace goes, when known
    started: bool = False
    problem: str | None = None

    def _post(self, path: str) -> str | None:
        url = f"{self.base_url.rstrip('/')}{path}"
        try:
            answer = BlockingSideClient(self.access, timeout_s=PROFILE_TIMEOUT_S).request("POST", url)
        except ItlauditError as exc:
            return f"{path}: {exc}"
        if answer.status == 404:
            return (
                f"no profile: the server has no {path} (start vLLM with --profiler-config "
                '\'{"profiler": "torch", "torch_profiler_dir": DIR}\')'
            )
        return None if answer.ok else f"no profile: POST {path} answered HTTP {answer.status}"

    def start(self) -> None:
        self.problem = self._post("/start_profile")
        self.started = self.problem is None

    def stop(self) -> ProfileRecord:
        """What meta.json records: whether a profile was taken, where it went, or why not."""
        if self.started:
            self.problem = self._post("/stop_profile")
        return ProfileRecord(
            profiled=self.started and self.problem is None, trace=self.trace, problem=self.problem
        )
