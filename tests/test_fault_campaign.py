"""The 2026-12-04 fault campaign's rows (docs/faults.md) that no other test drives end to end: each is
the real CLI against a tests/faultserver.py mode, a launched server, or a run folder's files, marked
with its row (`fault_row`). Rows whose test lives elsewhere carry the same marker there, and
tests/test_fault_campaign_index.py checks that every row has one.

To keep CI time low, one faultserver per mode serves the whole module, workloads are two short
requests, and the CLI runs in-process (simkit.itlaudit) wherever no signal or process death is part
of the case."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from faultkit import (
    launch_faultserver,
    processes_tagged,
    url_variant,
    write_scenario,
)
from simkit import itlaudit

from itlaudit.serve.launcher import LaunchedServer

fault_row = pytest.mark.fault_row
WORKLOAD = 'prompts = ["hi"]\nnum_requests = 2\nconcurrency = 1\nmax_tokens = 8\ntemperature = 0'
WORDS = "".join(f" a{step}" for step in range(1, 9))
# What a loaded 2-core box may honestly add to any run: reads merged, a capture loop that fell behind.
LOAD_FINDINGS = {"chunks_coalesced", "client_saturated"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., str]]:
    """Factory: the URL of a faultserver in MODE (with flags), started once for the whole module."""
    started: dict[tuple[str, ...], LaunchedServer] = {}
    logs = tmp_path_factory.mktemp("faultservers")

    def url(mode: str, *flags: str) -> str:
        key = (mode, *flags)
        if key not in started:
            started[key] = launch_faultserver(mode, *flags, log=logs / f"{len(started)}-{mode}.log")
        return started[key].url

    yield url
    for launched in started.values():
        launched.stop()


@pytest.fixture()
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test's folder as the working directory: an in-process run writes its ledger under ./reports."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def error_line(result: subprocess.CompletedProcess[str], code: int = 2) -> str:
    """The one `itlaudit:` line a failed command prints, last (progress lines may come before it)."""
    assert result.returncode == code, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("itlaudit:")]
    assert len(lines) == 1 and result.stderr.strip().endswith(lines[0]), result.stderr
    return lines[0]


def run_records(folder: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The run's records (by request id) and variant A's summary block."""
    records = [json.loads(line) for line in (folder / "requests.jsonl").read_text().splitlines()]
    summary = json.loads((folder / "summary.json").read_text())["variants"]["A"]
    return sorted(records, key=lambda record: record["request_id"]), summary


# --- what a server sends: each fault ends in its record and finding, none lost (N31) -------------


STREAM_FAULTS = [
    # mode, flags, status, error excerpt, findings, text kept
    pytest.param(
        "stall_headers",
        ("--stall-timeout", "1"),
        "timeout",
        "cut by stall_timeout_s = 1 s",
        {"stream_stalled"},
        "",
        marks=fault_row("2"),
        id="2-stall-after-headers",
    ),
    pytest.param(
        "not_json",
        (),
        "stream_error",
        "not JSON: 'this is not json at all'",
        {"stream_error"},
        " a1 a2",
        marks=fault_row("6"),
        id="6-not-json",
    ),
    pytest.param(
        "unavailable",
        (),
        "rate_limited",
        "Retry-After: 1 s",
        {"rate_limited"},
        "",
        marks=fault_row("7"),
        id="7-503-retry-after",
    ),
    pytest.param(
        "html_500",
        (),
        "http_error",
        "<h1>500 Internal Server Error</h1>",
        {"http_error"},
        "",
        marks=fault_row("7"),
        id="7-500-html",
    ),
    pytest.param(
        "usage_backwards",
        (),
        "ok",
        None,
        {"usage_non_monotonic"},
        WORDS,
        marks=fault_row("10"),
        id="10-backwards",
    ),
    pytest.param(
        "usage_partial", (), "ok", None, {"usage_missing"}, WORDS, marks=fault_row("10"), id="10-partial"
    ),
    pytest.param(
        "event_error",
        (),
        "stream_error",
        "engine died",
        {"stream_error"},
        " a1 a2",
        marks=fault_row("14"),
        id="14-event-error",
    ),
    pytest.param(
        "drip",
        ("--request-timeout", "2", "--stall-timeout", "1"),
        "timeout",
        "cut by request_timeout_s = 2 s",
        {"stream_stalled"},
        "",
        marks=fault_row("N18"),
        id="N18-drip",
    ),
    pytest.param(
        "close_delimited", (), "ok", None, set(), WORDS, marks=fault_row("N21"), id="N21-http10-close"
    ),
    pytest.param(
        "bad_chunk",
        (),
        "connection_error",
        "illegal chunk header: b'zz'",
        {"connection_error"},
        " a1 a2",
        marks=fault_row("N22"),
        id="N22-bad-chunk-size",
    ),
    # The clean neighbour: the same hand-written stream, nothing wrong with it.
    pytest.param("plain_sse", (), "ok", None, set(), WORDS, id="clean"),
]


@fault_row("N31")
@pytest.mark.parametrize(("mode", "flags", "status", "error", "findings", "text"), STREAM_FAULTS)
def test_a_server_fault_ends_in_its_record_and_finding(
    server: Callable[..., str],
    here: Path,
    mode: str,
    flags: tuple[str, ...],
    status: str,
    error: str | None,
    findings: set[str],
    text: str,
) -> None:
    path = write_scenario(here, url_variant("A", server(mode)), WORKLOAD)
    result = itlaudit("run", str(path), "--out", str(here / "run"), *flags)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    records, summary = run_records(here / "run")
    assert len(records) == summary["requests"] == 2  # every request is a record, whatever it met
    for record in records:
        assert record["status"] == status, record["error"]
        assert record["error"] is None if error is None else error in record["error"]
        assert record["text"] == text
    assert set(summary["findings"]) - LOAD_FINDINGS == findings, summary["findings"]
    report = (here / "run" / "report.md").read_text()
    assert "<h1>" not in report  # a server's markup is escaped in the report (row 31)
    limits = dict(zip(flags[::2], flags[1::2], strict=True))
    for record in records:  # a real end-to-end time: the limit that cut it (not the default 60 s)
        if record["timeout_limit"] is not None:
            limit_ms = (
                float(limits["--" + record["timeout_limit"].removesuffix("_s").replace("_", "-")]) * 1000
            )
            assert limit_ms <= record["e2e_ms"] < limit_ms + 2000, record
    if mode == "unavailable":  # Retry-After obeyed: the slot's next send waited it out
        assert records[1]["started_at_unix"] - records[0]["started_at_unix"] >= 1.0, records


@fault_row("4")
def test_a_5_mb_event_is_kept_whole(server: Callable[..., str], here: Path) -> None:
    path = write_scenario(here, url_variant("A", server("event_5mb")), WORKLOAD.replace("= 2", "= 1"))
    result = itlaudit("run", str(path), "--out", str(here / "run"))
    assert result.returncode == 0, result.stderr
    (record,), summary = run_records(here / "run")
    assert record["status"] == "ok" and len(record["text"]) == 5_000_000
    assert summary["requests"] == 1 and not set(summary["findings"]) - LOAD_FINDINGS


@fault_row("8")
@fault_row("N17")
@fault_row("N32")
@pytest.mark.parametrize(
    ("mode", "location"), [("redirect_307", "/v2/completions"), ("redirect_loop", "/v1/completions")]
)
def test_a_redirect_is_one_line_naming_its_location(
    server: Callable[..., str], here: Path, mode: str, location: str
) -> None:
    path = write_scenario(here, url_variant("A", server(mode)), WORKLOAD)
    line = error_line(itlaudit("run", str(path), "--out", str(here / "run")))
    assert f"HTTP 307 redirect to {location}" in line and "does not follow redirects" in line
    records = (here / "run" / "requests.jsonl").read_text().splitlines()
    assert records and json.loads(records[0])["status"] == "http_error"  # the rejected request is kept


# --- scale: every request kept, memory bounded ----------------------------------------------------

PEAK_RSS = (
    "import atexit, resource, sys\n"
    "from itlaudit.cli.app import main\n"
    "who = (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)\n"
    "peak = lambda: max(resource.getrusage(w).ru_maxrss for w in who)\n"
    "atexit.register(lambda: print(f'peak_rss_kb={peak()}', file=sys.stderr))\n"
    "main()\n"
)


def _peak_run(here: Path, url: str, requests: int, name: str) -> tuple[int, list[dict[str, Any]]]:
    """`itlaudit run` of `requests` at concurrency 64 in a fresh interpreter: its peak RSS (kB, itself or
    a capture worker) and its records."""
    workload = (
        f'prompts = ["hi"]\nnum_requests = {requests}\nconcurrency = 64\nmax_tokens = 8\ntemperature = 0'
    )
    path = write_scenario(here, url_variant("A", url), workload, name=name)
    result = subprocess.run(
        [sys.executable, "-c", PEAK_RSS, "run", str(path), "--out", str(here / name)],
        cwd=here,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    peak = int(result.stderr.rsplit("peak_rss_kb=", 1)[1].split()[0])
    return peak, [json.loads(line) for line in (here / name / "requests.jsonl").read_text().splitlines()]


@pytest.mark.heavy  # tens of seconds of simulated servers
@fault_row("15")
@fault_row("N19")
@fault_row("N30")
def test_many_streams_are_all_kept_and_memory_does_not_grow_with_the_run(
    server: Callable[..., str], here: Path
) -> None:
    """Rows 15/N30 ran 1000 and 5000 requests (229 and 288 MB peak); here 80 and 320 at 64 streams
    against 2 ms steps: every request kept once, and four times the requests cost no more than a
    little memory."""
    url = server("clean", "--step-ms", "2")
    small, _ = _peak_run(here, url, 80, "small")
    large, records = _peak_run(here, url, 320, "large")
    assert len(records) == len({record["request_id"] for record in records}) == 320
    assert all(record["status"] == "ok" for record in records)
    assert large < 500_000 and large - small < 60_000, (small, large)


# --- the run folder and the files a run reads -----------------------------------------------------


@fault_row("28")
def test_report_skips_a_half_cut_last_line_and_refuses_a_damaged_one(
    server: Callable[..., str], here: Path
) -> None:
    path = write_scenario(here, url_variant("A", server("plain_sse")), WORKLOAD)
    assert itlaudit("run", str(path), "--out", str(here / "run")).returncode == 0
    requests = here / "run" / "requests.jsonl"
    whole = requests.read_text()
    requests.write_text(whole + '{"request_id": "A-000')  # a crash mid-write
    result = itlaudit("report", str(here / "run"))
    assert result.returncode == 0, result.stderr
    assert json.loads((here / "run" / "summary.json").read_text())["variants"]["A"]["requests"] == 2
    first, second = whole.splitlines()
    requests.write_text(f'{first}\n{{"request_id": oops\n{second}\n')
    line = error_line(itlaudit("report", str(here / "run")))
    assert "requests.jsonl:2: not valid JSON" in line and "damaged" in line


@fault_row("N27")
def test_diff_ignores_a_corrupted_summary_or_meta(server: Callable[..., str], here: Path) -> None:
    """diff derives from requests.jsonl, so a damaged summary.json or meta.json changes nothing."""
    url = server("plain_sse")
    path = write_scenario(here, url_variant("A", url), WORKLOAD)
    for name in ("base", "new"):
        assert itlaudit("run", str(path), "--out", str(here / name)).returncode == 0
    clean = itlaudit("diff", str(here / "base"), str(here / "new"))
    assert clean.returncode == 0, clean.stderr
    for damage in (b'{"variants": {"A', b"\x00\xff\x13binary", b"[1, 2]", b"null", b'{"variants": null}'):
        for name in ("summary.json", "meta.json"):
            (here / "new" / name).write_bytes(damage)
        result = itlaudit("diff", str(here / "base"), str(here / "new"))
        assert result.returncode == 0, (damage, result.stderr)
        assert "Traceback" not in result.stderr and "| A |" in result.stdout, result.stdout


@fault_row("N25")
def test_out_through_a_symlink_is_followed_and_a_dangling_one_is_one_line(
    server: Callable[..., str], here: Path
) -> None:
    path = write_scenario(here, url_variant("A", server("plain_sse")), WORKLOAD)
    (here / "target").mkdir()
    (here / "link").symlink_to(here / "target")
    assert itlaudit("run", str(path), "--out", str(here / "link")).returncode == 0
    assert len((here / "target" / "requests.jsonl").read_text().splitlines()) == 2
    (here / "dangling").symlink_to(here / "nowhere" / "x")
    line = error_line(itlaudit("run", str(path), "--out", str(here / "dangling")))
    assert "cannot write the run folder" in line and "choose another --out" in line


NAMES = [
    pytest.param("variant", "../../evil", marks=fault_row("32"), id="32-traversal-variant"),
    pytest.param("run", "../../evil-scen", marks=fault_row("32"), id="32-traversal-run"),
    pytest.param("variant", '<img src=x onerror="alert(1)">', marks=fault_row("31"), id="31-markup"),
    pytest.param("run", "a|b [l](x) <script>", marks=fault_row("31"), id="31-markdown"),
    *(
        pytest.param("variant", name, marks=fault_row("N24"), id=f"N24-{index}")
        for index, name in enumerate(["café naïve", "abc\u202egpj.exe", "run 🚀", "K０", "a\x00b", "ﬁle"])
    ),
]


@pytest.mark.parametrize(("where", "name"), NAMES)
def test_a_name_that_is_not_a_plain_file_name_is_one_line_and_nothing_is_written(
    here: Path, where: str, name: str
) -> None:
    quoted = json.dumps(name, ensure_ascii=False)
    variant = f'[[variants]]\nname = {quoted if where == "variant" else json.dumps("A")}\nurl = "http://127.0.0.1:9"\n'
    path = here / "s.toml"
    path.write_text(
        f'name = {quoted if where == "run" else json.dumps("t")}\nendpoint = "completions"\n\n'
        f"[workload]\n{WORKLOAD}\n\n{variant}",
        encoding="utf-8",
    )
    before = set(here.parent.rglob("*"))
    line = error_line(itlaudit("run", str(path)))
    assert "s.toml:" in line and "a name is 1-64 letters" in line
    assert set(here.parent.rglob("*")) == before  # no folder, no report, nothing outside either


DATASETS = [
    pytest.param(
        "jsonl",
        b'{"prompt": "a"}\nnot json\n',
        "d.jsonl:2 is not JSON",
        marks=fault_row("N6"),
        id="N6-bad-line",
    ),
    pytest.param(
        "jsonl", b'{"prompt": "caf\xe9"}\n', "cannot be read as UTF-8", marks=fault_row("N8"), id="N8-latin1"
    ),
    pytest.param(
        "jsonl",
        b'{"text": "b"}\n',
        "d.jsonl:1 needs a non-empty `prompt`",
        marks=fault_row("N9"),
        id="N9-field",
    ),
    pytest.param("jsonl", b"", "holds no request", marks=fault_row("N9"), id="N9-empty"),
    pytest.param("jsonl", None, "which is a folder", marks=fault_row("N9"), id="N9-directory"),
    pytest.param(
        "sharegpt", b'[{"conversations": [', "is not JSON", marks=fault_row("N10"), id="N10-truncated"
    ),
    pytest.param(
        "sharegpt",
        b'{"conversations": []}',
        "holds no ShareGPT conversation",
        marks=fault_row("N10"),
        id="N10-not-a-list",
    ),
    pytest.param(
        "sharegpt",
        b'[{"conversations": [{"from": "gpt", "value": "hello"}]}]',
        "holds no ShareGPT conversation",
        marks=fault_row("N10"),
        id="N10-no-human-turn",
    ),
    pytest.param(
        "sharegpt",
        b"\x89PNG\r\n\x1a\n\x00\x00",
        "cannot be read as UTF-8",
        marks=fault_row("N10"),
        id="N10-binary",
    ),
]


@pytest.mark.parametrize(("kind", "content", "needle"), DATASETS)
def test_a_bad_dataset_file_is_one_line_naming_it(
    here: Path, kind: str, content: bytes | None, needle: str
) -> None:
    data = here / ("d.jsonl" if kind == "jsonl" else "d.json")
    if content is None:
        data.mkdir()
    else:
        data.write_bytes(content)
    workload = (
        f'num_requests = 2\nconcurrency = 1\n\n[workload.dataset]\nkind = "{kind}"\npath = "{data.name}"'
    )
    path = write_scenario(here, url_variant("A", "http://127.0.0.1:9"), workload)
    line = error_line(itlaudit("run", str(path), "--out", str(here / "run")))
    assert "d.json" in line and needle in line
    assert not (here / "run").exists()


@fault_row("N7")
def test_a_dataset_line_with_a_long_prompt_runs(server: Callable[..., str], here: Path) -> None:
    """A long prompt line is read, sent and recorded. Row N7 sent 10 MB; here 1,000,000 characters, just
    under the 1 MiB request body aiohttp servers (the simulator, the faultserver) accept by default,
    and past the simulator's context length, which is why the faultserver's own stream answers it."""
    (here / "d.jsonl").write_text(json.dumps({"prompt": "word " * 200_000}) + "\n", encoding="utf-8")
    dataset = '[workload.dataset]\nkind = "jsonl"\npath = "d.jsonl"'
    workload = f"num_requests = 2\nconcurrency = 1\nmax_tokens = 8\n\n{dataset}"
    path = write_scenario(here, url_variant("A", server("plain_sse")), workload)
    result = itlaudit("run", str(path), "--out", str(here / "run"))
    assert result.returncode == 0, result.stderr
    records, _ = run_records(here / "run")
    assert [record["status"] for record in records] == ["ok", "ok"]


@fault_row("N20")
def test_a_50_mb_reply_derives_in_bounded_time(server: Callable[..., str], here: Path) -> None:
    """The capture of one 50 MB event is row 4's path at 10× (a minute on this box); what broke was
    deriving it (over 6 minutes). So the record is written here and `report` derives it; the 10 s
    figure is benchmarks/derive_long_output.py's, this bound only catches a return to per-character
    loops under CI load."""
    path = write_scenario(here, url_variant("A", server("plain_sse")), WORKLOAD.replace("= 2", "= 1"))
    assert itlaudit("run", str(path), "--out", str(here / "run")).returncode == 0
    (record,), _ = run_records(here / "run")
    words = " the model kept writing about the regression test and its baseline 1024 times"
    record["text"] = (words * (50_000_000 // len(words) + 1))[:50_000_000]
    record["chunk_text_len"] = [len(record["text"]) // len(record["chunk_t_ms"])] * len(record["chunk_t_ms"])
    (here / "run" / "requests.jsonl").write_text(json.dumps(record) + "\n")
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "itlaudit", "report", str(here / "run")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert elapsed < 90, f"report on a 50 MB reply took {elapsed:.0f} s"
    (derived,) = [json.loads(line) for line in (here / "run" / "derived.jsonl").read_text().splitlines()]
    assert derived["request_id"] == record["request_id"]


# --- launched servers: one line each, nothing left behind ----------------------------------------


def _launch_variant(command: list[str], ready_timeout_s: float = 30) -> str:
    return (
        '[[variants]]\nname = "K0"\n\n[variants.launch]\nkind = "command"\n'
        f"ready_timeout_s = {ready_timeout_s}\ncommand = {json.dumps(command)}\n"
    )


SIM = [sys.executable, "-m", "itlaudit", "sim"]


@pytest.fixture()
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.parametrize(
    ("case", "needles"),
    [
        pytest.param(
            "exits",
            ("server exited with code 2 before becoming ready", "No such option: --bogus-arg"),
            marks=fault_row("21"),
        ),
        pytest.param("never_ready", ("not ready after 3s", "server-K0.log"), marks=fault_row("22")),
        pytest.param(
            "port_in_use", ("server exited with code", "address already in use"), marks=fault_row("23")
        ),
    ],
)
def test_a_launched_server_that_never_serves_is_an_error_with_its_tail(
    here: Path, busy_port: int, case: str, needles: tuple[str, ...]
) -> None:
    command = {
        "exits": [*SIM, "--port", "{port}", "--bogus-arg"],
        "never_ready": [sys.executable, "-c", "import time; time.sleep(60)"],
        "port_in_use": [*SIM, "--port", str(busy_port)],
    }[case]
    # A server that exits or fails to bind is seen whatever the limit: only never_ready waits it out.
    ready_timeout_s = 3 if case == "never_ready" else 60
    path = write_scenario(here, _launch_variant(command, ready_timeout_s), WORKLOAD)
    result = itlaudit("compare", str(path), "--out", str(here / "run"))
    assert result.returncode == 2, result.stderr
    message = " ".join(result.stderr.lower().split())  # the OS's wording: "Address already in use"
    assert all(needle.lower() in message for needle in needles), result.stderr
    assert not (here / "run" / "requests.jsonl").read_text()  # nothing was sent
    deadline = time.monotonic() + 5
    while processes_tagged(here / "run") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_tagged(here / "run") == []


@fault_row("25")
def test_sigint_during_compare_keeps_what_finished_and_stops_the_server(tmp_path: Path) -> None:
    command = [*SIM, "--port", "{port}", "--step-ms", "20"]
    workload = 'prompts = ["hi"]\nnum_requests = 100\nconcurrency = 2\nmax_tokens = 10\ntemperature = 0'
    path = write_scenario(tmp_path, _launch_variant(command), workload)
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "itlaudit", "compare", str(path), "--out", str(out)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not ((out / "requests.jsonl").is_file() and (out / "requests.jsonl").read_text().count("\n") >= 2):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("itlaudit: interrupted by SIGINT") and "Traceback" not in stderr, stderr
    kept = len((out / "requests.jsonl").read_text().splitlines())
    assert f"{kept} finished requests kept" in last
    assert (out / "report.md").is_file()
    deadline = time.monotonic() + 5
    while processes_tagged(out) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_tagged(out) == []


@fault_row("N29")
@pytest.mark.parametrize(
    ("flag", "value", "bound"),
    [
        ("--streams", "0", "1"),
        ("--streams", "-5", "1"),
        ("--chunks-per-s", "0", "0.001"),
        ("--tokens", "0", "2"),
        ("--tokens", "-1", "2"),
        ("--tokens-per-chunk", "0", "1"),
    ],
)
def test_selfcheck_with_an_absurd_argument_is_one_line(here: Path, flag: str, value: str, bound: str) -> None:
    line = error_line(itlaudit("selfcheck", flag, value, "--out", str(here / "sc")))
    assert f"Invalid value for '{flag}'" in line and f"greater than or equal to {bound}" in line
    assert not (here / "sc").exists()
