"""Secrets, end to end (fault rows 30, N14, N15, N15b): credentials planted everywhere a user puts
them (URL userinfo, --api-key, --header, a variant's headers, OPENAI_API_KEY / VLLM_API_KEY / HF_TOKEN
in the shell, a launched server's env and arguments), a server that quotes every header it got back
in a 401, then `compare`/`run` and `report`: no planted value is in any file under the test's folder
(run folder, ledger, server logs, the server pid folder) or on either terminal stream."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from faultkit import FAULTSERVER, itlaudit, one_error_line, write_scenario

from itlaudit.model.access import Access
from itlaudit.model.redact import MASK, RedactedStream, known_secrets, redact_json, redact_text

PLANTED = "sekrit"  # every planted value carries it, so one grep finds any of them


def leaks(root: Path, *streams: subprocess.CompletedProcess[str], skip: tuple[Path, ...] = ()) -> list[str]:
    """Where a planted value is: each file under root (but `skip`), and each command's stdout/stderr."""
    hits = [
        str(path)
        for path in root.rglob("*")
        if path.is_file() and path not in skip and PLANTED.encode() in path.read_bytes()
    ]
    for result in streams:
        hits += [
            f"{result.args[3:5]} {name}" for name in ("stdout", "stderr") if PLANTED in getattr(result, name)
        ]
    return hits


def launched(name: str, headers: str, *server_args: str) -> str:
    """A variant whose server is a faultserver in auth_echo mode, launched by itlaudit with credentials
    in its env and on its command line (the faultserver logs its arguments as vLLM does)."""
    command = json.dumps(
        [sys.executable, FAULTSERVER, "--port", "{port}", "--mode", "auth_echo", *server_args]
    )
    env = (
        f'{{ VLLM_API_KEY = "{PLANTED}LaunchEnv1", MY_PASSWORD = "{PLANTED}LaunchPw1", '
        f'AUTH_HEADER = "{PLANTED}LaunchAuth1", HF_TOKEN = "{PLANTED}LaunchHf1", '
        # credentials by kind (issue 39 item 4): named otherwise than key/token/secret/password, or
        # named innocently with a bearer token's look
        f'MY_PASSWD = "{PLANTED}Passwd1", DB_PWD = "{PLANTED}Pwd1", SESSION_COOKIE = "{PLANTED}Cookie1", '
        f'SERVICE_CREDENTIALS = "{PLANTED}Credentials1", UPSTREAM = "Bearer {PLANTED}Bearer1", '
        'VLLM_LOGGING_LEVEL = "INFO" }'
    )
    return (
        f'[[variants]]\nname = "{name}"\nheaders = {headers}\n\n[variants.launch]\nkind = "command"\n'
        f"command = {command}\nenv = {env}\n\n"
    )


@pytest.mark.fault_row("30")
@pytest.mark.fault_row("N15")
@pytest.mark.fault_row("R1")
def test_no_planted_secret_reaches_a_file_or_a_terminal_stream(tmp_path: Path) -> None:
    variants = launched(
        "K0",
        f'{{ "X-Api-Token" = "{PLANTED}VariantToken1" }}',
        "--api-key",
        f"{PLANTED}ServerArg1",
        "--db-passwd",
        f"{PLANTED}DbPasswd1",
    ) + launched(
        "K1", f'{{ "Authorization" = "Bearer {PLANTED}VariantAuth1" }}', f"--api-key={PLANTED}ServerArg2"
    )
    scenario = write_scenario(tmp_path, variants)
    (tmp_path / "tmp").mkdir()
    env = {
        "OPENAI_API_KEY": f"{PLANTED}OpenAiEnv1",
        "VLLM_API_KEY": f"{PLANTED}VllmEnv1",
        "HF_TOKEN": f"{PLANTED}ShellHf1",
        "TMPDIR": str(tmp_path / "tmp"),  # the launched servers' pid folder, grepped with the rest
    }
    out = tmp_path / "run"
    compared = itlaudit(
        "compare", str(scenario), "--out", str(out), "--api-key", f"{PLANTED}CliKey1",
        "--header", f"X-Secret-Token: {PLANTED}Header1", cwd=tmp_path, env=env, timeout=300,
    )  # fmt: skip
    assert compared.returncode == 0, compared.stderr
    reported = itlaudit("report", str(out), cwd=tmp_path, env=env)
    assert reported.returncode == 0, reported.stderr
    # The server did quote them: the identity ping's 401 is on the terminal and half the streams' 401s
    # are records, all with the values masked (row N15: that terminal line was in clear).
    assert "server build unknown" in compared.stderr and "Authorization=***" in compared.stderr
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    echoed = [r["error"] for r in records if r.get("http_status") == 401]
    assert echoed and all("X-Secret-Token=***" in e and "Authorization=***" in e for e in echoed)
    written = {p.name for p in tmp_path.rglob("*") if p.is_file()}
    assert written >= {"meta.json", "requests.jsonl", "requests.csv", "ledger.jsonl", "server-K0.log"}
    assert leaks(tmp_path, compared, reported, skip=(scenario,)) == []


@pytest.mark.fault_row("N15b")
def test_a_password_in_the_url_is_masked_in_every_file_and_line(faultserver, tmp_path: Path) -> None:
    port = faultserver("auth_echo").rpartition(":")[2]
    scenario = write_scenario(
        tmp_path, f'[[variants]]\nname = "A"\nurl = "http://user:{PLANTED}Pw1@127.0.0.1:{port}"\n'
    )
    env = {"OPENAI_API_KEY": "", "VLLM_API_KEY": ""}  # no Authorization beside the URL's userinfo
    result = itlaudit("run", str(scenario), "--out", str(tmp_path / "run"), cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    reported = itlaudit("report", str(tmp_path / "run"), cwd=tmp_path)
    assert reported.returncode == 0, reported.stderr
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert f"http://user:***@127.0.0.1:{port}" in json.dumps(meta)  # the user stays, the password goes
    assert leaks(tmp_path, result, reported, skip=(scenario,)) == []


KEY = f"{PLANTED}-right-key-0001"


def keyed_run(tmp_path: Path, url: str, env: dict[str, str], out: str) -> subprocess.CompletedProcess[str]:
    scenario = write_scenario(tmp_path, f'[[variants]]\nname = "A"\nurl = "{url}"\n')
    return itlaudit("run", str(scenario), "--out", str(tmp_path / out), cwd=tmp_path, env=env)


@pytest.mark.fault_row("N14")
def test_api_key_from_the_environment_in_vllm_bench_order_and_never_written(tmp_path: Path, paced) -> None:
    """VLLM_API_KEY alone is sent; OPENAI_API_KEY wins over it; a wrong key is one line quoting the
    server's 401 with the key masked; no key anywhere on disk or on the terminal."""
    server = paced(interval_ms=1.0, extra=("--api-key", KEY))  # 401 echoing the header it got
    wrong = f"{PLANTED}-wrong-key-0002"
    alone = keyed_run(tmp_path, server.url, {"OPENAI_API_KEY": "", "VLLM_API_KEY": KEY}, "alone")
    assert alone.returncode == 0, alone.stderr
    both = keyed_run(tmp_path, server.url, {"OPENAI_API_KEY": KEY, "VLLM_API_KEY": wrong}, "both")
    assert both.returncode == 0, both.stderr
    refused = keyed_run(tmp_path, server.url, {"OPENAI_API_KEY": wrong, "VLLM_API_KEY": ""}, "refused")
    line = one_error_line(refused)
    assert "401" in line and "***" in line
    paced_logs = tuple(tmp_path.glob("paced-*"))
    assert leaks(tmp_path, alone, both, refused, skip=(*paced_logs,)) == []


@pytest.mark.fault_row("N15b")
def test_a_url_with_credentials_and_an_api_key_is_one_line(tmp_path: Path) -> None:
    """Two answers to one question: refused before any folder, the password masked in the line (aiohttp
    raised a ValueError traceback on the pair)."""
    url = f"http://user:{PLANTED}Pw2@127.0.0.1:9"
    scenario = write_scenario(tmp_path, f'[[variants]]\nname = "A"\nurl = "{url}"\n')
    result = itlaudit("run", str(scenario), "--api-key", f"{PLANTED}Key2", cwd=tmp_path)
    line = one_error_line(result)
    assert line.startswith("itlaudit: error: variant A: http://user:***@127.0.0.1:9 carries credentials")
    assert leaks(tmp_path, result, skip=(scenario,)) == [] and not (tmp_path / "reports").exists()


def test_an_access_remembers_its_credentials_for_every_writer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Built once, known everywhere: an Access's secret headers, and the environment's secret names."""
    Access(headers=(("X-Team-Token", f"{PLANTED}Unit1"), ("X-Tenant", "tenant-a-public")))
    monkeypatch.setenv("MY_SERVICE_PASSWORD", f"{PLANTED}Unit2")
    assert {f"{PLANTED}Unit1", f"{PLANTED}Unit2"} <= known_secrets()
    assert "tenant-a-public" not in known_secrets()  # not a secret name: an experiment label
    echoed = f"401: got {PLANTED}Unit1 and {PLANTED}Unit2 for tenant-a-public"
    assert redact_text(echoed) == f"401: got {MASK} and {MASK} for tenant-a-public"
    assert redact_json({"error": [echoed], "n": 1}) == {"error": [redact_text(echoed)], "n": 1}


def test_the_terminal_stream_masks_every_write_and_is_otherwise_the_stream() -> None:
    Access(headers=(("Authorization", f"Bearer {PLANTED}Unit3"),))
    target = io.StringIO()
    stream = RedactedStream(target)
    assert stream.write(f"server said: key {PLANTED}Unit3 via http://u:pw-{PLANTED}@h:1/x\n") > 0
    stream.writelines(["plain\n"])
    assert target.getvalue() == f"server said: key {MASK} via http://u:{MASK}@h:1/x\nplain\n"
    assert stream.isatty() is False and stream.getvalue() == target.getvalue()  # delegated


# A launched server that logs what vLLM's start-up does (its arguments) and more (the credentials in
# its environment), then serves as the simulator: what smoke and invariance launch in the test below.
LOGGING_SIM = """
import os, sys
args = sys.argv[1:]
names = os.environ["PLANTED_NAMES"].split()
print("args:", args, {k: v for k, v in os.environ.items() if k in names}, flush=True)
cut = args.index("--db-passwd")
os.execv(sys.executable, [sys.executable, "-m", "itlaudit", "sim", *args[:cut], *args[cut + 2 :]])
"""
KINDS_ENV = (
    f'{{ MY_PASSWD = "{PLANTED}Passwd2", DB_PWD = "{PLANTED}Pwd2", SESSION_COOKIE = "{PLANTED}Cookie2", '
    f'SERVICE_CREDENTIALS = "{PLANTED}Credentials2", PLANTED_NAMES = "MY_PASSWD DB_PWD SESSION_COOKIE '
    'SERVICE_CREDENTIALS" }'
)
SHORT = (
    'prompts = ["hi"]\nnum_requests = 2\nconcurrency = 1\nmax_tokens = 8\nmin_tokens = 8\nignore_eos = true'
)


@pytest.mark.fault_row("R1")
def test_smoke_and_invariance_keep_every_planted_secret_out_of_their_files(tmp_path: Path) -> None:
    """Issue 39 item 4 under the other commands that launch servers: smoke's and invariance's server
    logs held the five planted credentials in clear (only run, compare and sweep masked their logs;
    the launcher now masks every log it wrote when it stops the server). ~5 s."""
    command = json.dumps(
        [sys.executable, "-c", LOGGING_SIM, "--port", "{port}", "--db-passwd", f"{PLANTED}DbPasswd2"]
    )
    launch = f'kind = "command"\ncommand = {command}\nenv = {KINDS_ENV}\nready_timeout_s = 60\n'
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "suite.toml").write_text(
        f'name = "kinds"\n[launch]\n{launch}\n[servers.K0]\nserver_args = ["--step-ms", "1"]\n\n'
        '[[checks]]\nscenario = "s"\nkind = "completion_tokens"\n'
    )
    (suite / "s.toml").write_text(
        f'name = "s"\nendpoint = "completions"\nmodel = "sim-tiny"\n[workload]\n{SHORT}\n'
        '[[variants]]\nname = "K0"\n'
    )
    smoked = itlaudit("smoke", "--suite", str(suite), "--out", str(tmp_path / "smoke"), cwd=tmp_path)
    assert smoked.returncode == 0, smoked.stdout + smoked.stderr
    scenario = write_scenario(tmp_path, f'[[variants]]\nname = "A"\n[variants.launch]\n{launch}', SHORT)
    out = str(tmp_path / "inv")
    audited = itlaudit(
        "invariance", str(scenario), "--repeats", "2", "--sweep", "", "--out", out, cwd=tmp_path
    )
    assert audited.returncode == 0, audited.stderr
    logs = list(tmp_path.rglob("server-*.log"))
    assert len(logs) == 2 and all("'--db-passwd', '***'" in log.read_text() for log in logs), logs
    assert leaks(tmp_path, smoked, audited, skip=(suite / "suite.toml", scenario)) == []
