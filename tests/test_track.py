"""itlaudit track: the history store on SQLite and on a real PostgreSQL server, and the change points of
a generated 60-nightly history (a 128-token cap on builds 25–32, a 30 % token-ITL slowdown from 40,
K3's speedup lost from 50 with K0 unchanged, noise, missing nightlies): exactly those, no false alarm.

The PostgreSQL server is the machine's own binaries (initdb, pg_ctl), a throwaway cluster in a tmp
folder on a free port, started once per session; as root it runs as the postgres user.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa
from simkit import itlaudit, sim_server
from track_scale import synthetic_point
from trackkit import FAMILY, MISSING, sixty_nightlies
from typer.testing import CliRunner

from itlaudit.analysis.changes import SERVER_SERIES, STREAM_SERIES
from itlaudit.cli.app import app
from itlaudit.serve.sim import SimConfig
from itlaudit.track.db import SCHEMA_VERSION, check_cache_table, open_history, schema_table

FIXTURE_RUN = Path(__file__).parent / "fixtures" / "runfolder-v1"


def _pg_bin() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    return found[-1].parent if found else None


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """A real PostgreSQL server for the session: its base URL (add a database name)."""
    bin_dir = _pg_bin()
    if bin_dir is None:
        pytest.skip("no PostgreSQL binaries in /usr/lib/postgresql (scripts/test installs them)")
    # Not under pytest's tmp folder: the postgres user must reach it, and pytest's root is private.
    root = Path(tempfile.mkdtemp(prefix="itlaudit-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:  # initdb refuses root
        shutil.chown(root, "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = root / "data"
    subprocess.run(
        [*as_user, str(bin_dir / "initdb"), "-D", str(data), "-U", "track", "--auth=trust"],
        check=True,
        capture_output=True,
    )
    options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
    subprocess.run(
        [
            *as_user,
            str(bin_dir / "pg_ctl"),
            "-D",
            str(data),
            "-o",
            options,
            "-l",
            str(root / "log"),
            "-w",
            "start",
        ],
        check=True,
        capture_output=True,
    )
    try:
        yield f"postgresql://track@127.0.0.1:{port}"
    finally:
        subprocess.run(
            [*as_user, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
            check=False,
            capture_output=True,
        )
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.heavy)])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty history: a SQLite file, or a new database on the session's PostgreSQL server."""
    if request.param == "sqlite":
        return str(tmp_path / "history.sqlite")
    import psycopg

    base = request.getfixturevalue("pg_server")
    name = f"h{uuid.uuid4().hex[:12]}"
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return f"{base}/{name}"


def _check(db: str, *extra: str) -> tuple[int, list[dict]]:
    result = CliRunner().invoke(app, ["track", "check", "--db", db, "--json", *extra])
    return result.exit_code, json.loads(result.stdout)


@pytest.mark.parametrize("seed", [0, 1])
def test_sixty_nightlies_find_exactly_the_planted_changes(db: str, seed: int) -> None:
    history = open_history(db)
    history.add_rows(sixty_nightlies(seed))
    history.close()
    code, changes = _check(db)
    found = [(c["order"], c["class"], c["kind"], c["state"]) for c in changes]
    assert found == [
        (25, "length/cap", "regression", "confirmed"),
        (33, "length/cap", "fix", "confirmed"),
        (40, "speed", "regression", "confirmed"),
        (50, "speedup", "regression", "confirmed"),
    ]
    cap, fix, slow, speedup = changes
    assert cap["summary"].startswith("output length changed: capped at 128 tokens from build")
    assert cap["closed_by"] == fix["build"] and cap["last_good_order"] == 24
    assert "token ITL p50 of K0 worse" in slow["summary"]
    assert slow["last_good_order"] == 39
    ratios = {e["variant"]: e["ratio"] for e in slow["evidence"] if e["series"] == "itl_p50"}
    assert set(ratios) == {"K0", "K3"} and all(1.2 < r < 1.4 for r in ratios.values())
    # K3's speedup is lost while K0 does not move: no K0 evidence at build 50.
    assert {e["variant"] for e in speedup["evidence"]} == {"K3"}
    assert speedup["last_good_order"] == 49
    assert code == 1  # the slowdown and the lost speedup are open


def test_noise_and_missing_nightlies_raise_no_alarm(db: str) -> None:
    history = open_history(db)
    history.add_rows(sixty_nightlies(3, planted=False))
    history.close()
    code, changes = _check(db, "--all")
    assert (code, changes) == (0, [])


def test_explained_changes_stop_counting_as_open(tmp_path: Path) -> None:
    db = str(tmp_path / "h.sqlite")
    history = open_history(db)
    history.add_rows(sixty_nightlies(0))
    history.close()
    _, changes = _check(db)
    for change in changes:
        if change["kind"] == "regression" and not change["closed_by"]:
            result = CliRunner().invoke(app, ["track", "explain", change["id"], "intended", "--db", db])
            assert result.exit_code == 0
    code, after = _check(db)
    assert code == 0
    assert [c["state"] for c in after if c["order"] in (40, 50)] == ["explained", "explained"]


def test_a_newest_build_off_its_series_is_suspected_not_an_alarm(tmp_path: Path) -> None:
    db = str(tmp_path / "h.sqlite")
    rng = np.random.default_rng(5)
    points = [
        synthetic_point(
            FAMILY, "K0", b, rng, itl_ms=20 * (1.5 if b == 30 else 1), acceptance=1, output_len=64
        )
        for b in range(1, 31)
    ]
    history = open_history(db)
    history.add_rows(points)
    history.close()
    code, changes = _check(db)
    assert code == 0
    assert [(c["order"], c["state"], c["kind"]) for c in changes] == [(30, "suspected", "regression")]
    assert changes[0]["summary"].endswith("; suspected: 1 more build off the series the same way confirms it")


def test_a_move_below_the_minimum_effect_is_no_change_in_any_series(tmp_path: Path) -> None:
    """--threshold applies to every series, the server's and the suspected newest build's too: a
    newest build 5 % off (token ITL, and the server's KV-cache usage with it) lists nothing at 10 %;
    the same history at 3 % lists the move, suspected."""
    db = str(tmp_path / "h.sqlite")
    rng = np.random.default_rng(5)
    points = []
    for b in range(1, 31):
        point = synthetic_point(
            FAMILY,
            "K0",
            b,
            rng,
            itl_ms=20 * (1.05 if b == 30 else 1),
            acceptance=1,
            output_len=64,
            noise=0.01,
        )
        kv = [0.5 * (0.95 if b == 30 else 1.0) * float(np.exp(rng.normal(0, 0.002))) for _ in range(8)]
        points.append(replace(point, samples={**point.samples, "server.kv_usage": kv}))
    history = open_history(db)
    history.add_rows(points)
    history.close()
    assert _check(db, "--all") == (0, [])
    code, changes = _check(db, "--all", "--threshold", "1.03")
    assert code == 0 and [(c["order"], c["state"]) for c in changes] == [(30, "suspected")]


def test_three_fast_builds_then_two_slower_is_a_confirmed_slowdown_and_nothing_else(tmp_path: Path) -> None:
    """A first-week history (issue 34): 1.6× slower from build 4 is found and confirmed on its two
    builds (the newest is not split off as a tail of its own), and the server's KV-cache usage, whose
    max moved while its samples did not, lists nothing."""
    db = str(tmp_path / "h.sqlite")
    rng = np.random.default_rng(1)
    points = []
    for b in range(1, 6):
        point = synthetic_point(
            FAMILY, "K0", b, rng, itl_ms=5 * (1.6 if b >= 4 else 1), acceptance=1, output_len=64
        )
        kv = [0.5, 0.5, 0.6 if b < 5 else 0.55]
        points.append(replace(point, samples={**point.samples, "server.kv_usage": kv}))
    history = open_history(db)
    history.add_rows(points)
    history.close()
    code, changes = _check(db, "--all")
    assert [(c["order"], c["class"], c["kind"], c["state"]) for c in changes] == [
        (4, "speed", "regression", "confirmed")
    ]
    assert changes[0]["build"] == "#4 0004cccccccc (0.32.0.dev)" and code == 1
    assert changes[0]["last_good_build"] == "#3 0003cccccccc (0.32.0.dev)"


def test_a_family_without_a_valid_point_cannot_be_told_exit_125(tmp_path: Path) -> None:
    """Twelve builds all capped: nothing was tested for speed, so `check` says so in one sentence and
    exits 125 (git bisect run's "cannot tell"), never 0; one valid build among the latest ten is
    enough to tell (the cap is then a change of its own)."""
    db = str(tmp_path / "h.sqlite")
    rng = np.random.default_rng(2)
    history = open_history(db)
    history.add_rows(
        [
            synthetic_point(FAMILY, "K3", b, rng, itl_ms=9, acceptance=2, output_len=256, cap=128)
            for b in range(1, 13)
        ]
    )
    history.close()
    result = CliRunner().invoke(app, ["track", "check", "--db", db])
    assert result.exit_code == 125, result.output
    assert re.search(
        r"0 valid points in 10 build\(s\) of family \w{12}: cannot tell — 10 of 10 capped at 128 tokens",
        result.stdout,
    ), result.stdout
    history = open_history(db)
    history.add_rows([synthetic_point(FAMILY, "K3", 13, rng, itl_ms=9, acceptance=2, output_len=256)])
    history.close()
    told = CliRunner().invoke(app, ["track", "check", "--db", db])
    assert "cannot tell" not in told.stdout and told.exit_code == 0, told.output


def test_track_add_records_a_run_folder_with_its_raw_samples(db: str) -> None:
    runner = CliRunner()
    for _ in range(2):  # the same folder twice is one set of points, not two
        result = runner.invoke(app, ["track", "add", str(FIXTURE_RUN), "--db", db, "--order", "7"])
        assert result.exit_code == 0, result.output
        assert "recorded 2 points from 1 run folder(s)" in result.stdout
    history = open_history(db)
    points = history.points()
    assert sorted(p.variant for p in points) == ["K0", "K3"]
    assert {p.order for p in points} == {7}
    # The fixture's K3 stopped at 8 of 16 tokens: analysis/validity.py's rule, kept with its cap.
    assert {p.variant: (p.validity, p.cap) for p in points} == {"K0": ("", None), "K3": ("length", 8)}
    samples = history.samples([p.id for p in points])
    assert all(len(s["itl_ms"]) == 3 and len(s["completion_tokens"]) == 3 for s in samples.values())
    assert history.schema_version() == SCHEMA_VERSION
    history.close()


def test_a_history_from_a_newer_itlaudit_is_refused(tmp_path: Path) -> None:
    db = str(tmp_path / "h.sqlite")
    history = open_history(db)
    with history.engine.begin() as conn:
        conn.execute(schema_table.insert().values(version=SCHEMA_VERSION + 1))
    history.close()
    result = CliRunner().invoke(app, ["track", "check", "--db", db])
    assert result.exit_code == 2
    assert "is newer than this itlaudit's" in result.stderr and "Traceback" not in result.output


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["track", "check", "--db", "{tmp}"], "is a directory"),
        (["track", "add", "{tmp}/none", "--db", "{tmp}/h.sqlite"], "no such run folder"),
        (["track", "add", "{tmp}", "--db", "{tmp}/h.sqlite"], "holds no run folder"),
        (["track", "check", "--db", "postgresql://u:hunter2@127.0.0.1:1/x"], "cannot open the history"),
        pytest.param(
            ["track", "check", "--db", "postgresql://u:hunter2@127.0.0.1:notaport/x"],
            "--db postgresql://u:***@127.0.0.1:notaport/x: not a history URL",
            marks=pytest.mark.fault_row("R38"),
        ),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path: Path, args: list[str], says: str) -> None:
    result = CliRunner().invoke(app, [a.replace("{tmp}", str(tmp_path)) for a in args])
    assert result.exit_code == 2
    assert says in result.stderr and "hunter2" not in result.output and "Traceback" not in result.output


def test_run_with_track_records_each_nightly_and_check_names_the_cap(tmp_path: Path) -> None:
    """Six nightlies of the simulator, `run --track`: builds 4-6 stop at 12 of 24 tokens. The cap is
    one change, named with its cap and its first build; the capped builds are no speed points."""
    db = str(tmp_path / "h.sqlite")
    for build in range(1, 7):
        config = SimConfig(ttft_ms=1, step_ms=1, cap_tokens=12 if build >= 4 else None, seed=build)
        with sim_server(config) as url:
            done = itlaudit(
                *("run", "--url", url, "--dataset-name", "random", "--random-input-len", "16"),
                *("--random-output-len", "24", "--num-prompts", "6", "--max-concurrency", "2"),
                *("--out", str(tmp_path / f"b{build}"), "--ledger", str(tmp_path / "ledger.jsonl")),
                *("--no-plots", "--metadata", f"build_order={build}", "--track", db),
            )
        assert done.returncode == 0, done.stderr
        assert "track: 1 points recorded in" in done.stdout
    checked = itlaudit("track", "check", "--db", db, "--json")
    # On the loaded 2-core box a build's client may be saturated (client_saturated fires): that point
    # is a "client" change, not a speed one, and says nothing about the cap.
    changes = [c for c in json.loads(checked.stdout) if c["class"] != "client"]
    assert [(c["order"], c["class"], c["kind"]) for c in changes] == [(4, "length/cap", "regression")]
    assert changes[0]["summary"].startswith("output length changed: capped at 12 tokens from build")
    assert checked.returncode == 1  # the cap is open: builds 4-6 are all capped


def _steady(builds: range, seed: int) -> list:
    rng = np.random.default_rng(seed)
    return [synthetic_point(FAMILY, "K0", b, rng, itl_ms=20, acceptance=1, output_len=64) for b in builds]


def test_a_speed_change_with_changed_server_args_is_a_method_change(tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    points = [
        synthetic_point(
            FAMILY,
            "K0",
            b,
            rng,
            itl_ms=20 * (0.7 if b >= 20 else 1),
            acceptance=1,
            output_len=64,
            method={"args": ["--max-num-seqs", "64" if b >= 20 else "256"]},
        )
        for b in range(1, 41)
    ]
    db = str(tmp_path / "h.sqlite")
    history = open_history(db)
    history.add_rows(points)
    history.close()
    code, changes = _check(db, "--all")
    assert [(c["order"], c["class"], c["kind"]) for c in changes] == [(20, "method", "improvement")]
    assert changes[0]["signals"]["method_changed"] is True
    assert code == 0


def test_failed_requests_are_a_correctness_change_never_a_speed_point(tmp_path: Path) -> None:
    points = _steady(range(1, 41), 12)
    # Builds 20-40 fail half their requests and look 40 % faster for it.
    broken = [
        replace(p, validity="correctness", reason="8 of 16 requests failed", samples={
            k: [v * 0.6 for v in vs] if k == "itl_ms" else vs for k, vs in p.samples.items()
        })
        if p.build_order >= 20 else p
        for p in points
    ]  # fmt: skip
    db = str(tmp_path / "h.sqlite")
    history = open_history(db)
    history.add_rows(broken)
    history.close()
    code, changes = _check(db, "--all")
    assert [(c["order"], c["class"], c["kind"]) for c in changes] == [(20, "correctness", "regression")]
    assert (
        changes[0]["summary"]
        == "outputs changed: 8 of 16 requests failed from build #20 0020cccccccc (0.32.0.dev) (K0)"
    )
    assert code == 1


def test_check_prints_the_open_changes_one_line_each(tmp_path: Path) -> None:
    db = str(tmp_path / "h.sqlite")
    history = open_history(db)
    history.add_rows(sixty_nightlies(0))
    history.close()
    result = CliRunner().invoke(app, ["track", "check", "--db", db])
    lines = result.stdout.splitlines()
    assert result.exit_code == 1
    assert [line.split("] ")[0].split(" [")[1] for line in lines[:-1]] == [
        "confirmed, speed, regression",
        "confirmed, speedup, regression",
    ]
    assert lines[-1] == f"2 open regression(s), 0 suspected, 4 change(s) in {db}"


# The 60 nightlies served by the command provider: a generated first-parent history, one nightly a
# day (the day's newest first-parent commit), the simulator at each commit's settings.
NIGHTLY_SIM = Path(__file__).parent / "fixtures" / "track" / "nightly_sim.py"
NIGHTLY_SCENARIO = Path(__file__).parent / "fixtures" / "track" / "nightly.toml"
# Days whose nightly holds three commits, the regression entering with the middle one; days whose
# nightly is a merge of a side branch; the one day whose build fails.
CULPRIT_DAYS = {25: "cap", 40: "slow", 50: "lost"}
MERGE_DAYS = {10, 30, 44}
UNBUILDABLE_DAY = 12


def _nightly_repo(path: Path, plan_path: Path, seed: int) -> dict[str, str]:
    """A git repository of 60 days of first-parent history (no commit on the MISSING days, so no
    nightly) and the plan each commit is served at. Returns {what: sha}: each culprit by its kind,
    the fix, and every day's nightly as `nightly-N`."""
    rng = np.random.default_rng(seed)
    base = 1_790_000_000  # 2026-09-21, a day's start in UTC + 8 h
    stream: list[str] = []
    plan: dict[str, dict] = {}
    state = {"cap": False, "slow": False, "lost": False}
    marks: list[tuple[int, str]] = []  # (mark, kind): first-parent commits in order
    mark = 0

    def commit(when: int, parent: int | None, merge: int | None = None) -> int:
        nonlocal mark
        mark += 1
        stream.extend([
            "commit refs/heads/main", f"mark :{mark}", f"committer t <t@example.com> {when} +0000",
            f"data {len(str(mark))}", str(mark),
        ])  # fmt: skip
        if parent:
            stream.append(f"from :{parent}")
        if merge:
            stream.append(f"merge :{merge}")
        stream.extend([f"M 644 inline f.txt\ndata {len(str(mark))}\n{mark}", ""])
        return mark

    previous: int | None = None
    for day in range(1, 61):
        if day in MISSING:
            continue
        start = base + day * 86_400
        hours = [0, 4 * 3600, 8 * 3600] if day in CULPRIT_DAYS else [8 * 3600]
        for n, hour in enumerate(hours):
            if day == 33:
                state["cap"] = False
            if day in CULPRIT_DAYS and n == 1:
                state[CULPRIT_DAYS[day]] = True
            side = None
            if day in MERGE_DAYS:
                side = commit(start + hour - 3600, previous)  # the side branch's own commit
            previous = commit(start + hour, previous, side)
            kind = CULPRIT_DAYS[day] if day in CULPRIT_DAYS and n == 1 else f"c{day}.{n}"
            marks.append((previous, kind))
            plan[str(previous)] = {
                "step_ms": 5.0 * (1.5 if state["slow"] else 1.0) * float(np.exp(rng.normal(0, 0.02))),
                "cap_tokens": 128 if state["cap"] else None,
                "acceptance_prob": 0.05 if state["lost"] else 0.9,
                "seed": int(rng.integers(1 << 30)),
                "ttft_ms": 150.0,  # the loaded box stalls a request's start by up to ~40 ms
                # Every build writes digit-heavy text, as vLLM on --load-format dummy does: gibberish on
                # both sides is a speed history all the same (analysis.validity's relative rule).
                "gibberish_after_tokens": 0,
            }
        marks.append((previous, f"nightly-{day}"))
    path.mkdir(parents=True)
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "PATH": "/usr/bin:/bin"}
    subprocess.run(["git", "-C", str(path), "init", "-q", "-b", "main"], check=True, env=env)
    subprocess.run(
        ["git", "-C", str(path), "fast-import", "--quiet", f"--export-marks={path.parent / 'marks'}"],
        input="\n".join(stream) + "\n", text=True, check=True, env=env,
    )  # fmt: skip
    subprocess.run(["git", "-C", str(path), "checkout", "-q", "main"], check=True, env=env)
    sha_of = dict(line.split() for line in (path.parent / "marks").read_text().splitlines())
    plan_path.write_text(json.dumps({sha_of[f":{m}"]: settings for m, settings in plan.items()}))
    return {kind: sha_of[f":{m}"] for m, kind in marks}


@pytest.mark.heavy  # ~150 simulated servers, three bisections: minutes
def test_nightly_over_sixty_simulated_nightlies_finds_classifies_and_bisects(tmp_path: Path) -> None:
    """`track nightly --auto` over the generated history, every build writing gibberish as a dummy-weight
    server does: exactly the cap (bisected to the commit that brought it, closed by its fix), the 1.5×
    slowdown and the lost speedup, each confirmed and bisected to the commit that brought it, and
    nothing else; the unbuildable build is skipped, the missing days are gaps. About 4 minutes on the
    2-core CI machine (54 builds × 2 servers, 3 bisections), so on SQLite only: what nightly writes
    to a PostgreSQL history and reads back is the capped-builds test's, on both (issue 37 item 7)."""
    db = str(tmp_path / "history.sqlite")
    shas = _nightly_repo(tmp_path / "vllm", tmp_path / "plan.json", seed=0)
    serve = f"{sys.executable} {NIGHTLY_SIM} --plan {tmp_path / 'plan.json'} {{commit}} {{port}}"
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / shas[f"nightly-{UNBUILDABLE_DAY}"]).touch()
    build = f"test ! -e {tmp_path / 'broken'}/{{commit}}"  # the build step fails for that one commit
    done = itlaudit(
        "track", "nightly", "--db", db, "--since", "2026-09-01", "--auto", "--out", str(tmp_path / "n"),
        "--provider", "command", "--repo", str(tmp_path / "vllm"), "--server-cmd", serve,
        "--build-cmd", build, "--scenario", str(NIGHTLY_SCENARIO), "--ready-timeout", "30",
        "--threshold", "1.2",  # the planted steps are 30 % and more; the box's load moves timings ~15 %
    )  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    assert "nightly: 54 build(s) probed, 1 skipped" in done.stdout, done.stdout + done.stderr
    code, everything = _check(db, "--all", "--threshold", "1.2")
    # A newest build alone off its series is suspected, not an alarm (it waits for another trial); a
    # client saturated by the loaded 2-core box is a client change, never a speed one (as above).
    changes = [c for c in everything if c["state"] != "suspected" and c["class"] != "client"]
    found = [(c["class"], c["kind"], c["signals"].get("culprit")) for c in changes]
    assert found == [
        ("length/cap", "regression", shas["cap"]),
        ("length/cap", "fix", None),
        ("speed", "regression", shas["slow"]),
        ("speedup", "regression", shas["lost"]),
    ], done.stdout
    cap, fix, slow, speedup = changes
    assert cap["summary"].startswith("output length changed: capped at 128 tokens from build")
    assert cap["closed_by"] == fix["build"] and shas["nightly-33"][:12] in fix["build"]
    assert "output length restored" in fix["summary"]
    for change, kind in ((cap, "cap"), (slow, "slow"), (speedup, "lost")):
        assert shas[kind][:12] in change["build"], change
    assert {e["variant"] for e in speedup["evidence"]} == {"K3"}
    assert done.returncode == code == 1  # the slowdown and the lost speedup are open
    assert all(c["state"] == "confirmed" for c in (cap, slow, speedup))
    ratios = [e["ratio"] for e in slow["evidence"] if e["series"] == "itl_p50"]
    assert ratios and all(1.35 < r < 1.7 for r in ratios), slow["evidence"]


def test_nightly_over_capped_builds_cannot_tell_exit_125(db: str, tmp_path: Path) -> None:
    """Every new build capped at 128 of 136 tokens: nothing was tested for speed, so `track nightly`
    says "cannot tell" in one sentence and exits 125, not 0. Two builds of K0 into each history
    backend (nightly's probes, build statuses and points through SQLite and PostgreSQL): about 10 s each."""
    commits = tmp_path / "commits.txt"
    shas = [f"{n:040x}" for n in range(1, 3)]
    commits.write_text("".join(f"{sha}\n" for sha in shas))
    plan = {
        sha: {"step_ms": 2.0, "cap_tokens": 128, "seed": n, "ttft_ms": 20.0} for n, sha in enumerate(shas)
    }
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    serve = f"{sys.executable} {NIGHTLY_SIM} --plan {tmp_path / 'plan.json'} {{commit}} {{port}}"
    done = itlaudit(
        "track", "nightly", "--db", str(tmp_path / "h.sqlite"), "--last", "2", "--out", str(tmp_path / "n"),
        "--provider", "command", "--commits-file", str(commits), "--scenario", str(NIGHTLY_SCENARIO),
        "--only", "K0", "--server-cmd", serve, "--ready-timeout", "30",
    )  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 125, done.stdout + done.stderr
    assert re.search(
        r"0 valid points in 2 build\(s\) of family \w{12}: cannot tell — 2 of 2 capped at 128 tokens",
        done.stdout,
    ), done.stdout


def test_incremental_check_searches_only_families_with_new_points(tmp_path: Path) -> None:
    """A second family untouched by last night keeps its cached changes (its cache row is not
    rewritten); the family with a new build is searched again; the answer is the full check's."""
    db = str(tmp_path / "h.sqlite")
    other = {**FAMILY, "model": "other"}
    history = open_history(db)
    history.add_rows(sixty_nightlies(0))
    history.add_rows([replace(p, series_fingerprint=other) for p in sixty_nightlies(1)])
    first = history.check()
    with history.engine.connect() as conn:
        before = dict(conn.execute(check_cache_table.select().with_only_columns(
            check_cache_table.c.family, check_cache_table.c.signature)).all())  # fmt: skip
    rng = np.random.default_rng(9)
    history.add_rows([synthetic_point(FAMILY, "K0", 61, rng, itl_ms=26, acceptance=1, output_len=256)])
    again = history.check()
    with history.engine.connect() as conn:
        after = dict(conn.execute(check_cache_table.select().with_only_columns(
            check_cache_table.c.family, check_cache_table.c.signature)).all())  # fmt: skip
        conn.execute(check_cache_table.delete())
        conn.commit()
    full = history.check()
    history.close()
    families = {c.family for c in first}
    assert len(families) == 2 and len(first) == 8
    changed = [f for f in families if before[f] != after[f]]
    assert len(changed) == 1 and {c.family for c in first if c.order == 25} == families
    assert [c.to_json() for c in again] == [c.to_json() for c in full]


def test_nightly_with_no_buildable_new_build_exits_125(tmp_path: Path) -> None:
    """git bisect run's 'cannot tell': every new build failed to build, so nothing was measured."""
    commits = tmp_path / "commits.txt"
    commits.write_text("".join(f"{n:040x}\n" for n in range(1, 4)))
    args = (
        "track", "nightly", "--db", str(tmp_path / "h.sqlite"), "--last", "2", "--out", str(tmp_path / "n"),
        "--provider", "command", "--commits-file", str(commits), "--scenario", str(NIGHTLY_SCENARIO),
        "--server-cmd", "unused {commit} {port}", "--build-cmd", "false {commit}",
    )  # fmt: skip
    done = itlaudit(*args)
    assert done.returncode == 125, done.stdout + done.stderr
    assert "nightly: 0 build(s) probed, 2 skipped" in done.stdout
    again = itlaudit(*args)
    # The same builds are not tried again: nothing new, nothing to tell.
    assert again.returncode == 0 and "nightly: 0 new build(s) of 2 in range" in again.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["track", "nightly", "--provider", "command", "--server-cmd", "x"], "give --since DATE or --last N"),
        (
            ["track", "nightly", "--since", "2026-11-01", "--provider", "command", "--server-cmd", "x",
             "--commits-file", "{tmp}/c.txt"],
            "--since needs commit dates",
        ),
        (["track", "nightly", "--last", "3", "--provider", "command"], "needs --server-cmd"),
        (["track", "nightly", "--last", "3", "--provider", "nosuch"], "nosuch"),
        (["track", "bisect", "0123456789"], "no such change"),
    ],
)  # fmt: skip
def test_nightly_and_bisect_bad_input_is_one_line_exit_2(tmp_path: Path, args: list[str], says: str) -> None:
    (tmp_path / "c.txt").write_text(f"{'a' * 40}\n")
    db = ["--db", str(tmp_path / "h.sqlite")]
    result = CliRunner().invoke(app, [a.replace("{tmp}", str(tmp_path)) for a in args] + db)
    assert result.exit_code == 2, result.output
    assert says in result.stderr and "Traceback" not in result.output


def test_a_change_no_nightly_probed_cannot_be_bisected(tmp_path: Path) -> None:
    """Points added by `track add` carry no provider: `track bisect` says how to get the builds."""
    db = str(tmp_path / "h.sqlite")
    history = open_history(db)
    history.add_rows(sixty_nightlies(0))
    slow = next(c for c in history.check() if c.change_class == "speed")
    history.close()
    result = CliRunner().invoke(app, ["track", "bisect", slow.id, "--db", db])
    assert result.exit_code == 2
    assert "were not probed by `track nightly`" in result.stderr and "Traceback" not in result.output


def test_a_recovered_ttft_does_not_close_a_slower_token_itl(tmp_path: Path) -> None:
    """TTFT rises at 10 and recovers at 30; token ITL rises at 20 and stays: the ITL regression is
    still open (a later speed improvement closes only a regression of the same series)."""
    rng = np.random.default_rng(13)
    points = []
    for b in range(1, 41):
        p = synthetic_point(
            FAMILY, "K0", b, rng, itl_ms=20 * (1.3 if b >= 20 else 1), acceptance=1, output_len=64
        )
        slow_start = 1.6 if 10 <= b < 30 else 1.0
        points.append(
            replace(p, samples={**p.samples, "ttft_ms": [v * slow_start for v in p.samples["ttft_ms"]]})
        )
    db = str(tmp_path / "h.sqlite")
    history = open_history(db)
    history.add_rows(points)
    history.close()
    code, changes = _check(db, "--all")
    itl = next(c for c in changes if c["order"] == 20)
    assert itl["kind"] == "regression" and itl["closed_by"] is None
    assert [(c["order"], c["kind"]) for c in changes if c["order"] in (10, 30)] == [
        (10, "regression"),
        (30, "improvement"),
    ]
    assert code == 1


def _sim_build(tmp_path: Path, db: str, build: int, kv_cache_tokens: int) -> None:
    """One simulated nightly, `run --track` with /metrics sampled every 50 ms."""
    config = SimConfig(ttft_ms=1, step_ms=4, seed=build, kv_cache_tokens=kv_cache_tokens)
    with sim_server(config) as url:
        done = itlaudit(
            *("run", "--url", url, "--dataset-name", "random", "--random-input-len", "64"),
            *("--random-output-len", "192", "--num-prompts", "8", "--max-concurrency", "4"),
            *("--out", str(tmp_path / f"b{build}"), "--metrics-period", "0.05"),
            *("--no-plots", "--metadata", f"build_order={build}", "--track", db),
        )
    assert done.returncode == 0, done.stderr


def test_server_metrics_become_series_and_a_kv_usage_change_is_flagged(tmp_path: Path) -> None:
    """A run folder's summary.json `server` block (the simulator's /metrics, sampled by default) is
    recorded as the server series; the simulator's KV cache shrunk to a quarter from build 5 is one
    `server` change on KV-cache usage, its figures in the evidence, and it counts as open."""
    db = str(tmp_path / "h.sqlite")
    for build in range(1, 9):
        _sim_build(tmp_path, db, build, 8192 if build < 5 else 2048)
    history = open_history(db)
    points = history.points()
    assert len(points) == 8 and all(p.values["kv_usage_p50"] for p in points)
    first, last = (p.values["kv_usage_p50"] for p in (points[0], points[-1]))
    assert first is not None and last is not None and 2.5 < last / first < 6
    samples = history.samples([points[0].id])[points[0].id]
    assert float(np.median(samples["server.kv_usage"])) == pytest.approx(first)
    assert len(samples["server.kv_usage"]) > 8 and len(samples["itl_ms"]) == 8
    history.close()
    checked = itlaudit("track", "check", "--db", db, "--json")
    changes = json.loads(checked.stdout)
    kv = [c for c in changes if any(e["series"] == "kv_usage_p50" for e in c["evidence"])]
    assert [(c["order"], c["kind"], c["state"]) for c in kv] == [(5, "regression", "confirmed")], changes
    moved = {e["series"]: e for e in kv[0]["evidence"]}
    assert moved["kv_usage_p50"]["ratio"] > 2.5
    # On the loaded 2-core box TTFT may move at the same build: the change is then a speed change
    # with the KV usage as its evidence; alone, it is a server change named by it.
    if not {s.name for s in STREAM_SERIES} & set(moved):
        assert kv[0]["class"] == "server" and "KV-cache usage" in kv[0]["summary"]
    assert checked.returncode == 1


def test_a_run_without_server_metrics_records_no_server_series(tmp_path: Path) -> None:
    """An old folder (no server_metrics.jsonl) ingests as before: the stream's series, no server one."""
    db = str(tmp_path / "h.sqlite")
    result = CliRunner().invoke(app, ["track", "add", str(FIXTURE_RUN), "--db", db, "--order", "1"])
    assert result.exit_code == 0, result.output
    history = open_history(db)
    points = history.points()
    assert points and all(p.values[s.name] is None for p in points for s in SERVER_SERIES)
    assert all(p.values["itl_p50"] for p in points if p.validity == "")
    samples = history.samples([p.id for p in points])
    assert not any(k.startswith("server.") for s in samples.values() for k in s)
    history.close()


def test_a_v2_history_is_upgraded_with_the_server_series(db: str) -> None:
    """A history written before the server series (schema 2: no columns for them) is upgraded in
    place on open: its points keep their figures, the server series read as absent, new points
    carry them. On SQLite and on PostgreSQL."""
    history = open_history(db)
    history.add_rows(sixty_nightlies(3)[:4])
    with history.engine.begin() as conn:
        for spec in SERVER_SERIES:
            conn.execute(sa.text(f"ALTER TABLE track_points DROP COLUMN {spec.name}"))
        conn.execute(schema_table.delete().where(schema_table.c.version > 2))
    assert history.schema_version() == 2
    history.close()
    upgraded = open_history(db)
    assert upgraded.schema_version() == SCHEMA_VERSION == 4
    points = upgraded.points()
    assert len(points) == 4 and all(p.values["itl_p50"] for p in points)
    assert all(p.values["kv_usage_p50"] is None for p in points)
    newer = replace(
        sixty_nightlies(3)[4], samples={**sixty_nightlies(3)[4].samples, "server.kv_usage": [0.25]}
    )
    upgraded.add([newer])
    assert [p.values["kv_usage_p50"] for p in upgraded.points()][-1] == 0.25
    upgraded.close()


def test_a_folder_killed_before_its_figures_is_not_recorded(tmp_path: Path) -> None:
    """Every record there, no summary.json (SIGKILL or a second signal while deriving): not a finished
    run, so one line naming the command that finishes it, and the history left as it was; the same
    folder once derived is recorded (test_track_add_records_a_run_folder_with_its_raw_samples). ~1 s."""
    folder = tmp_path / "run"
    shutil.copytree(FIXTURE_RUN, folder)
    (folder / "summary.json").unlink()
    db = tmp_path / "h.sqlite"
    result = CliRunner().invoke(app, ["track", "add", str(folder), "--db", str(db), "--order", "1"])
    assert result.exit_code == 2, result.output
    assert f"no summary.json, so the run did not finish deriving its figures; `itlaudit report {folder}`" in (
        " ".join(result.stderr.split())
    )
    assert not db.exists()  # refused before the history was opened: nothing written
