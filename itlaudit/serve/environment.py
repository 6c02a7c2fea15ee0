"""The environment record: what produced a result, so two results can be told comparable or not.

vLLM #47297 turned on facts no latency figure shows: the nightly's commit, the GPU (GB10, sm_121),
the architecture (aarch64) and the VLLM_* / CUTE_DSL_ARCH overrides the server ran with. Every run's
meta.json and every smoke report carries this record. Reads are small, off the measurement path
(between variants, never while requests stream), and a source that cannot be read is recorded as
unknown rather than failing the run. This module holds what the host and the launch tell; what the
server says about itself (/version, /metrics) is capture/server_info.py's, which assembles the record.
"""

from __future__ import annotations

import ast
import os
import platform
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from itlaudit import __version__
from itlaudit.model.launch import LaunchKind
from itlaudit.model.meta import GpuInfo, HostEnvironment
from itlaudit.model.redact import redact_env, redact_json

# Environment passed to the server that changes what the engine does (kernels, attention backend,
# arch-specific code paths): the overrides worth recording next to a result.
_RECORDED_ENV = re.compile(r"^(VLLM_.*|CUTE_DSL_ARCH|CUDA_VISIBLE_DEVICES|NVIDIA_VISIBLE_DEVICES)$")
# vLLM logs its parsed CLI at startup: `non-default args: {'model': ..., 'enforce_eager': True}`.
_NON_DEFAULT = re.compile(r"non-default args: (\{.*\})\s*$")
# Nightly versions carry the commit as a local version: 0.23.1rc1.dev601+ga16dbd5b8.
_COMMIT_IN_VERSION = re.compile(r"\+g?([0-9a-f]{7,40})\b")
_TIMEOUT_S = 5.0


def recorded_env(env: Mapping[str, str]) -> dict[str, str]:
    """The engine-relevant subset of an environment, secrets redacted."""
    return redact_env({key: value for key, value in sorted(env.items()) if _RECORDED_ENV.match(key)})


def server_env(launch_env: Mapping[str, str], kind: str) -> dict[str, str]:
    """What a launched server actually saw: docker gets only the `-e` values, a local process gets
    ours with the launch env layered over (launcher.launch does exactly this)."""
    return recorded_env(dict(launch_env) if kind == LaunchKind.DOCKER else {**os.environ, **launch_env})


def gpus() -> list[GpuInfo] | None:
    """Name, compute capability and driver of each local GPU; None when nvidia-smi is absent
    (a CPU host, or a remote server whose GPU this machine cannot see)."""
    if shutil.which("nvidia-smi") is None:
        return None
    query = ["nvidia-smi", "--query-gpu=name,compute_cap,driver_version", "--format=csv,noheader"]
    try:
        result = subprocess.run(query, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0:
        return None
    rows = [[part.strip() for part in line.split(",")] for line in result.stdout.splitlines() if line.strip()]
    return [GpuInfo(name=row[0], compute_capability=row[1], driver=row[2]) for row in rows if len(row) == 3]


def host_environment() -> HostEnvironment:
    """The machine itlaudit runs on: for a launched server, also the server's machine."""
    return HostEnvironment(
        itlaudit_version=__version__,
        cpu_architecture=platform.machine(),
        platform=platform.platform(),
        python=platform.python_version(),
        gpus=gpus(),
    )


def commit_of(version: str | None) -> str | None:
    match = _COMMIT_IN_VERSION.search(version or "")
    return match.group(1) if match else None


def non_default_args(log_path: Path | None) -> Mapping[str, object] | None:
    """vLLM's own account of its non-default arguments, read from a launched server's log: free-form
    (whatever vLLM's argparse produced, Python literals included), recorded as it is."""
    if log_path is None:
        return None
    try:
        lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:
        match = _NON_DEFAULT.search(line)
        if match:
            try:
                parsed = ast.literal_eval(match.group(1))
            except (ValueError, SyntaxError):
                return {"raw": match.group(1)}
            return redact_json({str(k): v for k, v in parsed.items()}) if isinstance(parsed, dict) else None
    return None
