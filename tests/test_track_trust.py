"""A history that trusts nothing it reads (issue 39 item 3): concurrent writers to one SQLite file, a
history damaged or edited by hand, and a `--db` URL that does not parse. Each damage ends `track add`,
`check` and `publish` in one line naming the table and row (where known), exit 2, and the history's
file as it was; the same commands on the undamaged copy are the clean neighbour. The dashboard's half
(hostile names and links, opened in chromium) is in tests/test_track_dashboard.py. CI cost: ~9 s for
the module on the 2-core box, 6 s of it the concurrent writers; each damage case is in-process, under
0.1 s after the shared history's 1 s.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa
from faultkit import one_error_line
from simkit import itlaudit
from trackkit import sixty_nightlies

from itlaudit.track.db import check_cache_table, open_history

FIXTURE_RUN = Path(__file__).parent / "fixtures" / "runfolder-v1"
WRITERS = 8


@pytest.mark.fault_row("R32")
def test_concurrent_track_adds_on_a_new_sqlite_history_lose_nothing(tmp_path: Path) -> None:
    """Eight `itlaudit track add` processes started at once on a history that does not exist yet, each
    with its own copy of the 3-request fixture folder and one folder they all share: every process
    exits 0 and the history holds 2 points a folder (the shared folder's once). Before WAL, the busy
    timeout and upserts, 6 of 66 such processes crashed on a UNIQUE constraint and their points were
    missing. CI cost: ~6 s on the 2-core box (eight interpreters of ~1 s each)."""
    db = tmp_path / "history.sqlite"
    shared = tmp_path / "shared"
    shutil.copytree(FIXTURE_RUN, shared)
    writers = []
    for i in range(WRITERS):
        own = tmp_path / f"run{i}"
        shutil.copytree(FIXTURE_RUN, own)
        command = ["track", "add", str(own), str(shared), "--db", str(db), "--order", str(i)]
        writers.append(
            subprocess.Popen(
                [sys.executable, "-m", "itlaudit", *command],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for writer in writers:
        _, stderr = writer.communicate(timeout=120)
        assert writer.returncode == 0, stderr
    history = open_history(str(db))
    points = history.points()
    history.close()
    assert len(points) == 2 * (WRITERS + 1)
    assert sorted(p.variant for p in points) == ["K0"] * (WRITERS + 1) + ["K3"] * (WRITERS + 1)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 60-nightly history (tests/trackkit.py), checked once so its cache is filled."""
    db = tmp_path_factory.mktemp("pristine") / "history.sqlite"
    history = open_history(str(db))
    history.add_rows(sixty_nightlies(0))
    history.check()
    history.close()
    return db


def _first_bad_point(db: Path) -> int:
    """The id of K0's point at build 40, the slowdown's first bad build: check reads its samples."""
    history = open_history(str(db))
    point = next(p for p in history.points() if p.order == 40 and p.variant == "K0")
    history.close()
    return point.id


def _execute(db: Path, statement: str) -> None:
    engine = sa.create_engine(f"sqlite:///{db}")
    with engine.begin() as conn:
        conn.exec_driver_sql(statement)
    engine.dispose()


def _bad_json(db: Path) -> str:
    row = _first_bad_point(db)
    _execute(db, f"UPDATE track_points SET samples = '{{\"itl_ms\": [1, ' WHERE id = {row}")
    return f"table track_points, row id={row}: samples"


def _unknown_validity(db: Path) -> str:
    row = _first_bad_point(db)
    _execute(db, f"UPDATE track_points SET validity = 'bogus' WHERE id = {row}")
    return f"table track_points, row id={row}: validity 'bogus' is not one of"


def _text_build_order(db: Path) -> str:
    row = _first_bad_point(db)
    _execute(db, f"UPDATE track_points SET build_order = 'forty' WHERE id = {row}")
    return f"table track_points, row id={row}: build_order 'forty' is not an integer"


def _dropped_column(db: Path) -> str:
    _execute(db, "ALTER TABLE track_points DROP COLUMN reason")
    return "table track_points: has no column reason"


def _corrupted_pages(db: Path) -> str:
    """Four pages from the middle of the file (track_points' rows: most of it) overwritten."""
    data = bytearray(db.read_bytes())
    page = 4096
    middle = len(data) // 2 // page * page
    data[middle : middle + 4 * page] = b"\x55" * (4 * page)
    db.write_bytes(bytes(data))
    return ""  # what SQLite says of it depends on which command meets which page first


DAMAGES: dict[str, tuple[str, Callable[[Path], str]]] = {
    "bad JSON": ("R33", _bad_json),
    "dropped column": ("R34", _dropped_column),
    "corrupted pages": ("R35", _corrupted_pages),
    "unknown validity": ("R36", _unknown_validity),
    "text build order": ("R36", _text_build_order),
}


@pytest.mark.parametrize("command", ["add", "check", "publish"])
@pytest.mark.parametrize(
    "damage",
    [None, *(pytest.param(name, marks=pytest.mark.fault_row(row)) for name, (row, _) in DAMAGES.items())],
)
def test_a_damaged_history_is_one_line_and_nothing_is_written(
    pristine: Path, tmp_path: Path, damage: str | None, command: str
) -> None:
    """Every damage (and None, the clean neighbour) under each command that reads the history."""
    db = tmp_path / "history.sqlite"
    shutil.copy(pristine, db)
    says = DAMAGES[damage][1](db) if damage is not None else None
    before = _sha(db)
    args = {
        "add": ["track", "add", str(FIXTURE_RUN), "--order", "61"],
        "check": ["track", "check"],
        "publish": ["track", "publish", "--out", str(tmp_path / "site")],
    }[command]
    result = itlaudit(*args, "--db", str(db))
    if says is None:
        assert result.returncode == (1 if command == "check" else 0), result.stderr  # check: 2 open
        return
    line = one_error_line(result)
    assert says in line, line
    assert "nothing was written to it" in line or "cannot open the history" in line
    assert _sha(db) == before
    assert not (tmp_path / "site" / "index.html").exists()


@pytest.mark.fault_row("R37")
def test_a_check_cache_row_that_does_not_read_is_searched_again(pristine: Path, tmp_path: Path) -> None:
    """The check's cache is derived: a row of it hand-edited into bad JSON (or the wrong shape) is
    searched again and rewritten, and the check answers as on the clean history."""
    db = tmp_path / "history.sqlite"
    shutil.copy(pristine, db)
    clean = itlaudit("track", "check", "--db", str(db), "--json")
    assert clean.returncode == 1, clean.stderr
    for damage in ("[{", '[{"id": 1}]'):
        engine = sa.create_engine(f"sqlite:///{db}")
        with engine.begin() as conn:
            conn.execute(sa.update(check_cache_table).values(changes=damage))
        engine.dispose()
        again = itlaudit("track", "check", "--db", str(db), "--json")
        assert (again.returncode, json.loads(again.stdout)) == (1, json.loads(clean.stdout)), again.stderr
        engine = sa.create_engine(f"sqlite:///{db}")
        with engine.connect() as conn:
            cached = conn.execute(sa.select(check_cache_table.c.changes)).scalars().all()
        engine.dispose()
        assert all(isinstance(json.loads(text), list) for text in cached)


def test_a_read_only_history_is_still_read(pristine: Path, tmp_path: Path) -> None:
    """WAL is asked of every SQLite connection; a history file that cannot take it (read-only, in the
    rollback journal an older itlaudit wrote) is still read, and check answers from a stale cache
    it cannot rewrite as from a writable copy."""
    db = tmp_path / "history.sqlite"
    shutil.copy(pristine, db)
    _execute(db, "DELETE FROM track_check_cache")
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA journal_mode=DELETE")
    writable = itlaudit("track", "check", "--db", str(db), "--json")
    _execute(db, "DELETE FROM track_check_cache")
    before = _sha(db)
    read_only = itlaudit("track", "check", "--db", f"sqlite:///file:{db}?mode=ro&uri=true", "--json")
    assert writable.returncode == 1, writable.stderr
    assert (read_only.returncode, read_only.stdout) == (1, writable.stdout), read_only.stderr
    assert _sha(db) == before
