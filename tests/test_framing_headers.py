"""Headers that would break the request's HTTP framing (fault row N23): a second Content-Length or
Transfer-Encoding, Host, Connection and the other hop-by-hop names, or a CR, LF or NUL anywhere, in
--header, a variant's `headers` or the API key, are one line and exit 2, and nothing reaches the server;
an ordinary header is sent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from faultkit import itlaudit, one_error_line, url_variant, write_scenario

from itlaudit.model.access import FRAMING_HEADERS, header_problem


@pytest.mark.parametrize("name", sorted(FRAMING_HEADERS))
def test_every_framing_header_is_refused_in_any_case(name: str) -> None:
    assert header_problem(name, "5") is not None
    assert header_problem(name.upper(), "5") is not None


@pytest.mark.parametrize(
    ("name", "value"),
    [("X-A", "b\r\nX-Injected: 1"), ("X-A", "b\nc"), ("X-A", "b\rc"), ("X-A", "b\0c"), ("X-A\r\nX-B", "1")],
)
def test_control_characters_in_a_name_or_value_are_refused(name: str, value: str) -> None:
    problem = header_problem(name, value)
    assert problem is not None and "control character" in problem
    assert value not in problem  # the reason never quotes a value: it may be a credential


def test_an_ordinary_header_passes() -> None:
    assert header_problem("X-Team-Token", "a b\tc") is None
    assert header_problem("Authorization", "Bearer k") is None


def run(tmp_path: Path, url: str, *args: str, variants: str | None = None, env: dict[str, str] | None = None):
    scenario = write_scenario(tmp_path, variants or url_variant("A", url))
    return itlaudit("run", str(scenario), "--out", str(tmp_path / "run"), *args, cwd=tmp_path, env=env)


@pytest.mark.fault_row("N23")
@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (("--header", "Content-Length: 5"), {}, "--header 'Content-Length'"),
        (("--header", "Transfer-Encoding: chunked"), {}, "--header 'Transfer-Encoding'"),
        (("--header", "host: elsewhere"), {}, "--header 'host'"),
        (("--header", "X-A: b\r\nX-Injected: 1"), {}, "--header 'X-A'"),
        (("--header", "X-A: b\nX-Injected: 1"), {}, "--header 'X-A'"),
        (("--api-key", "k\r\nX-Injected: 1"), {}, "--api-key"),
        ((), {"OPENAI_API_KEY": "k\nX-Injected: 1"}, "OPENAI_API_KEY"),
    ],
)
def test_a_header_that_breaks_framing_is_one_line_and_nothing_is_sent(
    faultserver, tmp_path: Path, args: tuple[str, ...], env: dict[str, str], named: str
) -> None:
    log = tmp_path / "requests.log"
    url = faultserver("clean", "--request-log", str(log))
    before = log.read_bytes() if log.exists() else b""  # the launcher's readiness probes
    line = one_error_line(run(tmp_path, url, *args, env=env))
    assert line.startswith(f"itlaudit: error: {named}: "), line
    assert "X-Injected" not in line and "chunked" not in line  # values are not quoted
    assert (log.read_bytes() if log.exists() else b"") == before  # nothing reached the server
    assert not (tmp_path / "run").exists() and not (tmp_path / "reports").exists()


@pytest.mark.fault_row("N23")
@pytest.mark.parametrize(
    "headers", ['{ "Content-Length" = "5" }', '{ "Connection" = "close" }', '{ "X-A" = "b\\r\\nX-B: 1" }']
)
def test_a_variant_header_that_breaks_framing_is_one_line(faultserver, tmp_path: Path, headers: str) -> None:
    url = faultserver("clean")
    variants = url_variant("A", url) + f"headers = {headers}\n"
    line = one_error_line(run(tmp_path, url, variants=variants))
    assert "headers" in line and ("frames the HTTP request" in line or "control character" in line), line


@pytest.mark.fault_row("N23")
def test_an_ordinary_header_is_sent_and_the_run_is_clean(faultserver, tmp_path: Path) -> None:
    log = tmp_path / "requests.log"
    url = faultserver("clean", "--request-log", str(log))
    result = run(tmp_path, url, "--header", "X-Team: a")
    assert result.returncode == 0, result.stderr
    streams = [json.loads(line) for line in log.read_text().splitlines() if json.loads(line)["stream"]]
    assert len(streams) == 4
