"""Launcher: exact argv per kind, readiness, failure messages, and above all no processes left behind."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest

from itlaudit.errors import LaunchError
from itlaudit.model.launch import LaunchKind, LaunchSpec, launch_kind_problem
from itlaudit.serve.launcher import (
    command_argv,
    docker_argv,
    free_port,
    launch,
    python_argv,
    sglang_argv,
)

REPO = Path(__file__).resolve().parents[1]

# A stand-in for vLLM: answers /health and /v1/models, and (like vLLM's EngineCore) has a child process,
# so teardown is tested on a process tree rather than a single pid.
FAKE_SERVER = textwrap.dedent(
    """
    import http.server, json, subprocess, sys
    port, info_path = int(sys.argv[1]), sys.argv[2]
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(info_path, "w") as fh:
        json.dump({"argv": sys.argv, "child": child.pid}, fh)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b'{"object":"list","data":[{"id":"tiny"}]}' if self.path == "/v1/models" else b""
            self.send_response(200 if self.path in ("/health", "/v1/models") else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
    """
)


def _alive(pid: int) -> bool:
    """A pid counts as alive if /proc has it and it is not a zombie awaiting its (new) parent's reap."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _gone_soon(pid: int, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def _read_info(path: Path, timeout_s: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            return json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            time.sleep(0.05)
    raise AssertionError(f"fake server never wrote {path}")


@pytest.fixture
def fake_spec(tmp_path: Path) -> LaunchSpec:
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    return LaunchSpec(
        kind="command",
        command=[sys.executable, str(script), "{port}", str(tmp_path / "info.json")],
        ready_timeout_s=20,
    )


def test_python_argv_exact() -> None:
    spec = LaunchSpec(
        kind="python",
        python="/venvs/vllm/bin/python",
        model="/models/tiny",
        served_model_name="tiny",
        server_args=["--enforce-eager", "--speculative-config", '{"method": "draft_model"}'],
    )
    assert python_argv(spec, 1234) == [
        "/venvs/vllm/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/models/tiny",
        "--served-model-name",
        "tiny",
        "--host",
        "127.0.0.1",
        "--port",
        "1234",
        "--enforce-eager",
        "--speculative-config",
        '{"method": "draft_model"}',
    ]


def test_sglang_argv_exact_names_its_own_flags(tmp_path: Path) -> None:
    spec = LaunchSpec(
        kind="sglang",
        python=str(tmp_path),
        model="/models/tiny",
        served_model_name="tiny",
        server_args=["--speculative-algorithm", "NGRAM", "--enable-deterministic-inference"],
    )
    assert sglang_argv(spec, 30000) == [
        str(tmp_path / "bin" / "python"),
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/models/tiny",
        "--served-model-name",
        "tiny",
        "--host",
        "127.0.0.1",
        "--port",
        "30000",
        "--speculative-algorithm",
        "NGRAM",
        "--enable-deterministic-inference",
    ]
    with pytest.raises(LaunchError, match=r"^launch kind 'sglang' needs a python interpreter"):
        sglang_argv(LaunchSpec(kind="sglang", model="m"), 1)


def test_python_argv_accepts_venv_dir(tmp_path: Path) -> None:
    spec = LaunchSpec(kind="python", python=str(tmp_path), model="m")
    assert python_argv(spec, 1)[0] == str(tmp_path / "bin" / "python")


def test_docker_argv_mounts_local_model_dir(tmp_path: Path) -> None:
    model = tmp_path / "tiny"
    model.mkdir()
    spec = LaunchSpec(
        kind="docker",
        image="vllm/vllm-openai:v0.24.0",
        model=str(model),
        served_model_name="tiny",
        server_args=["--enforce-eager"],
        env={"VLLM_USE_FLASHINFER_SAMPLER": "0", "CUTE_DSL_ARCH": "sm_90a"},
        docker_extra=["--shm-size", "1g"],
    )
    assert docker_argv(spec, 5555, "itl-x") == [
        "docker",
        "run",
        "--rm",
        "--name",
        "itl-x",
        "--gpus",
        "all",
        "--ipc=host",
        "-p",
        "5555:8000",
        "-e",
        "VLLM_USE_FLASHINFER_SAMPLER=0",
        "-e",
        "CUTE_DSL_ARCH=sm_90a",
        "-v",
        f"{model}:{model}",
        "--shm-size",
        "1g",
        "vllm/vllm-openai:v0.24.0",
        "--model",
        str(model),
        "--served-model-name",
        "tiny",
        "--port",
        "8000",
        "--enforce-eager",
    ]


def test_docker_argv_hub_model_not_mounted() -> None:
    spec = LaunchSpec(kind="docker", image="vllm/vllm-openai:latest", model="org/name", gpus="device=1")
    assert docker_argv(spec, 7000, "n") == [
        "docker",
        "run",
        "--rm",
        "--name",
        "n",
        "--gpus",
        "device=1",
        "--ipc=host",
        "-p",
        "7000:8000",
        "vllm/vllm-openai:latest",
        "--model",
        "org/name",
        "--port",
        "8000",
    ]


def test_command_argv_substitutes_per_element_without_splitting() -> None:
    spec = LaunchSpec(
        kind="command",
        command=["serve", "{model}", "--bind={host}:{port}", "--note", "a b {port}"],
        model="/models/with space/tiny",
        host="0.0.0.0",
    )
    assert command_argv(spec, 9000) == [
        "serve",
        "/models/with space/tiny",
        "--bind=0.0.0.0:9000",
        "--note",
        "a b 9000",
    ]


def test_command_argv_leaves_other_braces_alone() -> None:
    spec = LaunchSpec(kind="command", command=["x", '{"method": "draft_model", "port": "{port}"}', "{gpu}"])
    assert command_argv(spec, 1) == ["x", '{"method": "draft_model", "port": "1"}', "{gpu}"]


def test_free_port_is_bindable() -> None:
    """A server can listen on the port at once and a client reach it there (port 0 would bind a
    different port, an occupied one would not bind)."""
    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", port))
        server.listen()
        assert server.getsockname()[1] == port
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            accepted, _ = server.accept()
            accepted.close()


def test_launch_ready_then_stop_leaves_no_process(fake_spec: LaunchSpec, tmp_path: Path) -> None:
    spec = replace(fake_spec, model="/models/with space/tiny", command=[*fake_spec.command, "{model}"])
    server = launch(spec, tmp_path / "server.log")
    info = _read_info(tmp_path / "info.json")
    assert server.url.startswith("http://127.0.0.1:")
    assert info["argv"][1] == server.url.rsplit(":", 1)[1]
    assert info["argv"][-1] == "/models/with space/tiny"  # one argument, never shell-split
    parent, child = server.pid, info["child"]
    assert parent is not None and _alive(parent) and _alive(child)
    server.stop()
    assert _gone_soon(parent) and _gone_soon(child)
    server.stop()  # idempotent


def test_context_manager_stops_on_exception(fake_spec: LaunchSpec, tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), launch(fake_spec, tmp_path / "server.log") as server:
        parent = server.pid
        child = _read_info(tmp_path / "info.json")["child"]
        raise RuntimeError("benchmark failed")
    assert parent is not None and _gone_soon(parent) and _gone_soon(child)


def test_early_exit_error_has_exit_code_and_log_tail(tmp_path: Path) -> None:
    spec = LaunchSpec(
        kind="command",
        command=[sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"],
        ready_timeout_s=20,
    )
    with pytest.raises(LaunchError) as err:
        launch(spec, tmp_path / "server.log")
    message = str(err.value)
    assert "code 3" in message
    assert "boom" in message
    assert str(tmp_path / "server.log") in message


def test_log_tail_is_limited_to_last_lines(tmp_path: Path) -> None:
    code = "import sys\nfor i in range(100): print(f'line{i}')\nsys.exit(1)"
    spec = LaunchSpec(kind="command", command=[sys.executable, "-c", code], ready_timeout_s=20)
    with pytest.raises(LaunchError) as err:
        launch(spec, tmp_path / "server.log")
    assert "line99" in str(err.value) and "line84" not in str(err.value)


def test_readiness_timeout_kills_the_process(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    code = (
        f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid()));"
        " print('loading', flush=True); time.sleep(600)"
    )
    spec = LaunchSpec(kind="command", command=[sys.executable, "-c", code], ready_timeout_s=1.5)
    with pytest.raises(LaunchError, match=r"not ready after 1\.5s") as err:
        launch(spec, tmp_path / "server.log")
    assert "loading" in str(err.value)
    assert _gone_soon(int(pid_file.read_text()))


def test_url_kind_waits_for_an_existing_server(fake_spec: LaunchSpec, tmp_path: Path) -> None:
    with launch(fake_spec, tmp_path / "owned.log") as owned:
        attached = launch(LaunchSpec(kind="url", url=owned.url + "/"), tmp_path / "unused.log")
        assert attached.url == owned.url
        assert attached.pid is None
        attached.stop()  # no process of ours: must not touch the owned server
        assert owned.pid is not None and _alive(owned.pid)


def test_url_kind_timeout(tmp_path: Path) -> None:
    spec = LaunchSpec(kind="url", url=f"http://127.0.0.1:{free_port()}", ready_timeout_s=1)
    with pytest.raises(LaunchError, match="not ready after 1s"):
        launch(spec, tmp_path / "unused.log")


def test_sigint_inside_with_block_leaves_no_process(fake_spec: LaunchSpec, tmp_path: Path) -> None:
    """Ctrl-C in the benchmark process must take the server's whole tree down with it."""
    driver = tmp_path / "driver.py"
    driver.write_text(
        textwrap.dedent(
            f"""
            import sys, time
            from pathlib import Path
            from itlaudit.model.launch import LaunchSpec
            from itlaudit.serve.launcher import launch
            spec = LaunchSpec(kind="command", command={fake_spec.command!r}, ready_timeout_s=20)
            with launch(spec, Path({str(tmp_path / "server.log")!r})) as server:
                print(server.pid, flush=True)
                time.sleep(600)
            """
        )
    )
    proc = subprocess.Popen(
        [sys.executable, str(driver)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert proc.stdout is not None
        server_pid = int(proc.stdout.readline())
        child = _read_info(tmp_path / "info.json")["child"]
        assert _alive(server_pid) and _alive(child)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "KeyboardInterrupt" in stderr
    assert _gone_soon(server_pid) and _gone_soon(child)


def test_unknown_launch_kind_is_one_line_naming_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(LaunchError) as caught:
        launch(LaunchSpec(kind="podman"), tmp_path / "server.log")
    assert str(caught.value) == "launch kind 'podman': use one of python, sglang, docker, command, url"


def test_a_launch_table_names_a_kind_that_starts_a_server() -> None:
    assert all(launch_kind_problem(kind) is None for kind in LaunchKind if kind is not LaunchKind.URL)
    assert "give the variant a `url`" in (launch_kind_problem("url") or "")
    assert launch_kind_problem("k8s") == "must be one of python, sglang, docker, command, got 'k8s'"
