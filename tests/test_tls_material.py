"""TLS material (fault row N16): a --ca-cert that is not PEM, a directory, missing or unreadable is one
line naming the file and what to give, exit 2, before any run folder exists; a self-signed server is
refused without flags and measured with --insecure or with its certificate as --ca-cert."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from faultkit import ROOT, itlaudit, one_error_line, url_variant, write_scenario

from itlaudit.model.access import TLS_ADVICE, tls_problem
from itlaudit.serve.launcher import free_port

# tests/faultserver.py's clean simulator behind TLS: the campaign's "self-signed server".
HTTPS_SERVER = """
import ssl, sys
from aiohttp import web
from faultserver import make_fault_app
from itlaudit.serve.sim import SimConfig
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(sys.argv[2], sys.argv[3])
app = make_fault_app("clean", SimConfig(step_ms=2.0))
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), ssl_context=context, print=None, access_log=None)
"""


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A self-signed certificate (its own CA) for 127.0.0.1, made by the openssl CLI; key.pem beside."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed: cannot make a test certificate")
    folder = tmp_path_factory.mktemp("tls")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(folder / "key.pem"), "-out", str(folder / "cert.pem"), "-days", "2",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return folder / "cert.pem"


@pytest.fixture()
def https_url(certificate: Path) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests")}
    command = [
        sys.executable,
        "-c",
        HTTPS_SERVER,
        str(port),
        str(certificate),
        str(certificate.parent / "key.pem"),
    ]
    server = subprocess.Popen(command, env=env)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "the https server did not start"
                time.sleep(0.1)
        yield f"https://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=10)


def not_pem(folder: Path) -> Path:
    path = folder / "notes.txt"
    path.write_text("this is not a certificate\n")
    return path


def test_tls_problem_names_what_is_wrong(tmp_path: Path, certificate: Path) -> None:
    assert tls_problem(str(certificate)) is None
    assert "no such file" in (tls_problem(str(tmp_path / "nope.pem")) or "")
    assert "is a directory" in (tls_problem(str(tmp_path)) or "")
    assert "holds no PEM certificate" in (tls_problem(str(not_pem(tmp_path))) or "")
    (tmp_path / "empty.pem").write_text("")
    assert "holds no PEM certificate" in (tls_problem(str(tmp_path / "empty.pem")) or "")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file: no unreadable file to test with")
def test_an_unreadable_ca_cert_says_so(tmp_path: Path, certificate: Path) -> None:
    copy = tmp_path / "cert.pem"
    copy.write_bytes(certificate.read_bytes())
    copy.chmod(0)
    assert "cannot be read" in (tls_problem(str(copy)) or "")


@pytest.mark.fault_row("N16")
@pytest.mark.parametrize("case", ["not PEM", "directory", "missing"])
def test_bad_ca_cert_is_one_line_before_any_run_folder(tmp_path: Path, case: str) -> None:
    given = {"not PEM": not_pem(tmp_path), "directory": tmp_path, "missing": tmp_path / "nope.pem"}[case]
    expected = {
        "not PEM": "holds no PEM certificate",
        "directory": "is a directory",
        "missing": "no such file",
    }
    scenario = write_scenario(tmp_path, url_variant("A", "https://127.0.0.1:9"))
    result = itlaudit("run", str(scenario), "--ca-cert", str(given), cwd=tmp_path)
    line = one_error_line(result)
    assert line.startswith(f"itlaudit: error: --ca-cert {given}: {expected[case]}"), line
    assert "PEM file of CA certificates" in line
    assert not (tmp_path / "reports").exists()  # no run folder, no ledger


@pytest.mark.fault_row("N16")
def test_a_self_signed_server_needs_insecure_or_its_certificate(
    tmp_path: Path, certificate: Path, https_url: str
) -> None:
    scenario = write_scenario(tmp_path, url_variant("A", https_url))
    refused = itlaudit("run", str(scenario), "--out", str(tmp_path / "plain"), cwd=tmp_path)
    line = one_error_line(refused)
    assert "self-signed certificate" in line and line.endswith(TLS_ADVICE), line
    for flags, out in ((("--insecure",), "insecure"), (("--ca-cert", str(certificate)), "ca")):
        result = itlaudit("run", str(scenario), "--out", str(tmp_path / out), *flags, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert len((tmp_path / out / "requests.jsonl").read_text().splitlines()) == 4
