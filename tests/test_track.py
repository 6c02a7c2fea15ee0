"""itlaudit track: the history store on SQLite and on a real PostgreSQL server, and the change points of
a generated 60-nightly history (a 128-token cap on builds 25–32, a 30 % token-ITL slowdown from 40,
K3's speedup lost from 50 with K0 unchanged, noise, missing nightlies): exactly those, no false alarm.

The PostgreSQL server is the machine's own binaries (initdb, pg_ctl), a throwaway cluster in a tmp
folder on a free port, started once per session; as root it runs as the postgres user.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from simkit import itlaudit, sim_server
from track_scale import synthetic_point
from trackkit import FAMILY, sixty_nightlies
from typer.testing import CliRunner

from itlaudit.cli.app import app
from itlaudit.serve.sim import SimConfig
from itlaudit.track.db import SCHEMA_VERSION, open_history, schema_table

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


@pytest.fixture(params=["sqlite", "postgresql"])
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
        == "outputs changed: 8 of 16 requests failed from build 0.32.0.dev 0020cccccccc (K0)"
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
