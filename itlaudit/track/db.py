"""The history store: one schema through SQLAlchemy Core, on a SQLite file or a PostgreSQL server.

SQLite is the default (nothing to install, one file); PostgreSQL, by URL, is a history several
machines share. The schema is created and upgraded by MIGRATIONS, numbered steps applied in order
and recorded in `track_schema`, so a history written by an older itlaudit is upgraded in place and a
newer one is refused rather than misread. A point keeps its series values as columns (what `check`
scans) and its per-request raw figures as one JSON text (fetched only around a change point).
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import json
import sqlite3
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict, TypeVar

import msgspec
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from itlaudit.analysis.changes import (
    CLIENT,
    CORRECTNESS,
    LENGTH,
    SAMPLE_FIELDS,
    SERIES,
    SERVER_SERIES,
    VALID,
    Blind,
    Change,
    ChangeJSON,
    CheckSettings,
    Point,
    PointState,
    Samples,
    annotate,
    blind_families,
    find_changes,
    point_values,
)
from itlaudit.errors import TrackError
from itlaudit.model.jsonvalue import JSONMapping, JSONObject
from itlaudit.model.redact import redact_url

DEFAULT_DB = Path("~/.cache/itlaudit/history.sqlite")
_meta = sa.MetaData()
schema_table = sa.Table("track_schema", _meta, sa.Column("version", sa.Integer, nullable=False))
series_table = sa.Table(
    "track_series",
    _meta,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("key", sa.String(64), nullable=False, unique=True),
    sa.Column("family", sa.String(64), nullable=False, index=True),
    sa.Column("variant", sa.Text, nullable=False),
    sa.Column("fingerprint", sa.Text, nullable=False),  # JSON: what the key was made of
)
points_table = sa.Table(
    "track_points",
    _meta,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("series_id", sa.Integer, sa.ForeignKey("track_series.id"), nullable=False, index=True),
    sa.Column("run_id", sa.Text, nullable=False),
    sa.Column("run_dir", sa.Text),
    sa.Column("recorded_at", sa.Float, nullable=False),
    sa.Column("build_order", sa.BigInteger, nullable=False),
    sa.Column("build_version", sa.Text),
    sa.Column("build_commit", sa.Text),
    sa.Column("build_flavour", sa.Text),
    sa.Column("method", sa.String(16), nullable=False),
    sa.Column("validity", sa.String(16), nullable=False),
    sa.Column("reason", sa.Text),
    sa.Column("cap", sa.Integer),
    sa.Column("requests", sa.Integer, nullable=False),
    sa.Column("errors", sa.Integer, nullable=False),
    *(sa.Column(spec.name, sa.Float) for spec in SERIES),
    sa.Column("samples", sa.Text, nullable=False),  # JSON: {figure: [per-request value, ...]}
    sa.UniqueConstraint("series_id", "run_id", name="track_points_series_run"),
)
notes_table = sa.Table(
    "track_notes",
    _meta,
    sa.Column("change_id", sa.String(16), primary_key=True),
    sa.Column("note", sa.Text, nullable=False),
    sa.Column("at", sa.Float, nullable=False),
)


# What `track nightly` has done per source (its provider and scenario, SOURCE digest): each build
# probed or skipped, so a build is probed once, and the settings a later `track bisect` reuses.
sources_table = sa.Table(
    "track_sources",
    _meta,
    sa.Column("family", sa.String(64), primary_key=True),
    sa.Column("settings", sa.Text, nullable=False),  # JSON: bisect.settings.Settings without the ends
)
builds_table = sa.Table(
    "track_builds",
    _meta,
    sa.Column("source", sa.String(64), primary_key=True),
    sa.Column("ref", sa.String(128), primary_key=True),
    sa.Column("build_order", sa.BigInteger, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),  # BUILD_STATUSES
    sa.Column("reason", sa.Text),
    sa.Column("at", sa.Float, nullable=False),
)
PROBED, SKIPPED, FAILED = "probed", "skipped", "failed"  # what a nightly did with a build
BUILD_STATUSES = (PROBED, SKIPPED, FAILED)
# A change's bisection (`track bisect`): its answer, written onto the change when it is read.
bisects_table = sa.Table(
    "track_bisects",
    _meta,
    sa.Column("change_id", sa.String(16), primary_key=True),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("culprit", sa.Text),
    sa.Column("result", sa.Text, nullable=False),  # JSON: message, last good, candidates, folder
    sa.Column("at", sa.Float, nullable=False),
)
# The incremental check: each family's changes as last found, with what they were found from (its
# points' count and newest id, the settings); a family whose signature is unchanged is not searched.
check_cache_table = sa.Table(
    "track_check_cache",
    _meta,
    sa.Column("family", sa.String(64), primary_key=True),
    sa.Column("signature", sa.Text, nullable=False),
    sa.Column("changes", sa.Text, nullable=False),  # JSON: [Change.to_json(), ...]
)


def _v1(conn: sa.Connection) -> None:
    """The first schema: series, points (values and raw samples), notes on changes."""
    _meta.create_all(conn, tables=[series_table, points_table, notes_table])


def _v2(conn: sa.Connection) -> None:
    """Nightly sources and builds, bisections of changes, the incremental check's cache."""
    _meta.create_all(conn, tables=[sources_table, builds_table, bisects_table, check_cache_table])


def _v3(conn: sa.Connection) -> None:
    """A column per server series (changes.SERVER_SERIES: KV usage, acceptance, GPU clock, ...) on
    track_points; a point recorded before them has none (NULL). A history _v1 created from this
    module's table already has them (the table is declared with every series), so only missing ones
    are added."""
    present = {column["name"] for column in sa.inspect(conn).get_columns(points_table.name)}
    float_type = sa.Float().compile(dialect=conn.dialect)
    for spec in SERVER_SERIES:
        if spec.name not in present:
            conn.execute(sa.text(f"ALTER TABLE {points_table.name} ADD COLUMN {spec.name} {float_type}"))


def _v4(conn: sa.Connection) -> None:
    """The energy series (gpu_joules_per_token), added as _v3 added the first server series."""
    _v3(conn)


# Append a step to change the schema (ALTER TABLE through conn); never edit one that has shipped.
MIGRATIONS: Sequence[Callable[[sa.Connection], None]] = (_v1, _v2, _v3, _v4)
SCHEMA_VERSION = len(MIGRATIONS)


def digest(data: Any) -> str:
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class NewPoint:
    """A point to record: its fingerprint, build, validity and raw per-request figures.

    `series_fingerprint` is everything but the build and the method (platform, model, variant,
    workload, client settings); `method` is what may change between builds and is then a method
    change (server args, environment, build flavour)."""

    series_fingerprint: JSONMapping
    variant: str
    run_id: str
    run_dir: str | None
    build_order: int
    build_version: str | None
    build_commit: str | None
    build_flavour: str | None
    method: JSONMapping
    validity: str
    reason: str | None
    cap: int | None
    errors: int
    samples: Samples

    @property
    def series_key(self) -> str:
        return digest({**self.series_fingerprint, "variant": self.variant})

    @property
    def family(self) -> str:
        return digest(dict(self.series_fingerprint))


class BisectRecord(TypedDict):
    """A change's bisection as track_bisects holds it: its status, culprit, and the answer's JSON
    (bisect.json's result, its folder, a failure's message)."""

    status: str
    culprit: str | None
    result: JSONObject


def _build_label(version: str | None, commit: str | None, order: int) -> str:
    """A build as a change names it: its first-parent order and commit, the server's version string
    only beside them (two nightlies of one release share it: "vLLM 0.32.0" names neither)."""
    label = f"#{order} {commit[:12]}" if commit else f"#{order}"
    return f"{label} ({version})" if version else label


class History:
    """A connection to one history; every read and write goes through here.

    Nothing read is trusted: a cell that does not hold what this module wrote (JSON that does not
    parse or has the wrong shape, a validity or build status no itlaudit writes, a dropped column)
    is a TrackError naming its table and row, never a traceback further on. A write first audits the
    whole history (`_audit`), so a damaged one is refused before anything is written into it."""

    def __init__(self, engine: sa.Engine, where: str) -> None:
        self.engine = engine
        self.where = where
        self._audited = False
        self._opened = False  # until migrate() has read the schema, a refusal is "cannot open"

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """What the database itself refuses (a damaged page, a missing table, a lock held past the
        busy timeout) as one line naming the history; the transaction is rolled back."""
        try:
            yield
        except sa.exc.SQLAlchemyError as exc:
            if not self._opened:
                raise TrackError(f"--db {self.where}: cannot open the history ({_said(exc)})") from None
            said = _said(exc)
            raise TrackError(
                f"{self.where}: the history cannot be read or written ({said}); nothing was written to it"
            ) from None

    @contextmanager
    def _read(self) -> Iterator[sa.Connection]:
        with self._guard(), self.engine.connect() as conn:
            yield conn

    @contextmanager
    def _write(self, *, audit: bool = True) -> Iterator[sa.Connection]:
        """A write transaction (on SQLite BEGIN IMMEDIATE: concurrent writers queue on the busy timeout
        instead of failing when a read would have to become a write). The first write of this handle
        audits the history first (`audit=False`: the schema's own steps and the check's cache, which is
        derived and rebuilt whenever it does not read)."""
        with self._guard(), self.engine.connect() as conn:
            conn.execution_options(**{_WRITE: True})
            with conn.begin():
                if audit and not self._audited:
                    self._audit(conn)
                    self._audited = True
                yield conn

    def migrate(self) -> None:
        """Create or upgrade the schema; refuse a history written by a newer itlaudit, or one whose
        tables lack a column this itlaudit reads (dropped by hand). A history already at this schema
        takes no write lock; creating or upgrading one is serialized between processes (SQLite's
        write lock, a PostgreSQL advisory lock), so concurrent first writers create it once."""
        with self._read() as conn:
            current = self._version(conn)
        if current < SCHEMA_VERSION:
            with self._write(audit=False) as conn:
                if conn.dialect.name == "postgresql":
                    conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK})
                _meta.create_all(conn, tables=[schema_table])
                current = self._version(conn)
                for version in range(current + 1, SCHEMA_VERSION + 1):
                    MIGRATIONS[version - 1](conn)
                    conn.execute(sa.insert(schema_table).values(version=version))
        if current > SCHEMA_VERSION:
            raise TrackError(
                f"{self.where}: history schema {current} is newer than this itlaudit's "
                f"({SCHEMA_VERSION}); upgrade itlaudit"
            )
        with self._read() as conn:
            inspector = sa.inspect(conn)
            for table in _meta.sorted_tables:
                present = {column["name"] for column in inspector.get_columns(table.name)}
                missing = [column.name for column in table.columns if column.name not in present]
                if missing:
                    raise damaged(self.where, table.name, None, f"has no column {', '.join(missing)}")
        self._opened = True

    @staticmethod
    def _version(conn: sa.Connection) -> int:
        if not sa.inspect(conn).has_table(schema_table.name):
            return 0
        return int(conn.execute(sa.select(sa.func.max(schema_table.c.version))).scalar() or 0)

    def schema_version(self) -> int:
        with self._read() as conn:
            return self._version(conn)

    def _audit(self, conn: sa.Connection) -> None:
        """The whole history read for what a write must not build on: SQLite's pages (quick_check),
        every enumerated value, and on SQLite (whose columns hold any type) every number and JSON text.
        On the 10,000-build × 20-fingerprint history of benchmarks/track_scale.py (281 MB) this is
        about 1 s; on PostgreSQL the server keeps the types and a JSON text is checked when read."""
        if conn.dialect.name == "sqlite":
            found = " ".join(str(row[0]) for row in conn.exec_driver_sql("PRAGMA quick_check(1)"))
            if found != "ok":
                said = " ".join(found.replace("*** in database main ***", "").split())
                raise damaged(self.where, None, None, f"SQLite finds its file damaged ({said})")
        for table, audits in _audits(conn.dialect.name).items():
            keys = list(table.primary_key.columns)
            cells = [table.c[name] for name, _, _ in audits]
            flags = [bad.label(f"bad{i}") for i, (_, bad, _) in enumerate(audits)]
            query = sa.select(*keys, *cells, *flags).where(sa.or_(*(bad for _, bad, _ in audits))).limit(1)
            row = conn.execute(query).first()
            if row is not None:
                first = next(i for i in range(len(audits)) if row[len(keys) + len(cells) + i])
                name, _, what = audits[first]
                said = f"{name} {_shown(row[len(keys) + first])} {what}"
                raise damaged(self.where, table.name, _row_name(keys, row), said)

    def add(self, points: Iterable[NewPoint]) -> int:
        """Record points; a point already recorded (same series, same run) is replaced under a new id
        (so the check's cache sees its family change), and adding a folder twice does not count it
        twice; one a concurrent writer inserts meanwhile is updated (an upsert), not a
        UNIQUE-constraint failure. Returns how many were written."""
        p = points_table
        rows = []
        with self._write() as conn:
            series_ids: dict[str, int] = {}
            for point in points:
                key = point.series_key
                if key not in series_ids:
                    series_ids[key] = self._series_id(conn, point)
                sid = series_ids[key]
                conn.execute(sa.delete(p).where(p.c.series_id == sid, p.c.run_id == point.run_id))
                rows.append(self._row(point, sid))
            if rows:
                _upsert(conn, p, rows, ("series_id", "run_id"))
        return len(rows)

    def add_rows(self, points: Sequence[NewPoint]) -> None:
        """Bulk insert of new points (no replacement): for generated histories and the benchmark."""
        with self._write(audit=False) as conn:
            ids: dict[str, int] = {}
            rows = []
            for point in points:
                key = point.series_key
                if key not in ids:
                    ids[key] = self._series_id(conn, point)
                rows.append(self._row(point, ids[key]))
            if rows:
                conn.execute(sa.insert(points_table), rows)

    @staticmethod
    def _series_id(conn: sa.Connection, point: NewPoint) -> int:
        """The series' id, inserted if new; a series another writer inserts at the same moment is
        taken as it is (INSERT ... ON CONFLICT DO NOTHING, then read)."""
        key = point.series_key
        query = sa.select(series_table.c.id).where(series_table.c.key == key)
        found = conn.execute(query).scalar()
        if found is None:
            row = {
                "key": key,
                "family": point.family,
                "variant": point.variant,
                "fingerprint": json.dumps(dict(point.series_fingerprint), sort_keys=True),
            }
            insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
            conn.execute(insert(series_table).values(row).on_conflict_do_nothing(index_elements=["key"]))
            found = conn.execute(query).scalar_one()
        return int(found)

    @staticmethod
    def _row(point: NewPoint, series_id: int) -> dict[str, Any]:
        samples = {k: [None if v is None else float(v) for v in vs] for k, vs in point.samples.items()}
        return {
            "series_id": series_id,
            "run_id": point.run_id,
            "run_dir": point.run_dir,
            "recorded_at": time.time(),
            "build_order": point.build_order,
            "build_version": point.build_version,
            "build_commit": point.build_commit,
            "build_flavour": point.build_flavour,
            "method": digest(dict(point.method)),
            "validity": point.validity,
            "reason": point.reason,
            "cap": point.cap,
            "requests": max((len(samples.get(name, ())) for name in SAMPLE_FIELDS), default=0),
            "errors": point.errors,
            **point_values(samples),
            "samples": json.dumps(samples, separators=(",", ":")),
        }

    def points(self, families: Collection[str] | None = None) -> list[Point]:
        """Every point (of the given families, None: all), without its samples, in build order."""
        p, s = points_table, series_table
        columns = [
            p.c.id,
            s.c.family,
            s.c.variant,
            p.c.build_order,
            p.c.build_version,
            p.c.build_commit,
            p.c.method,
            p.c.validity,
            p.c.reason,
            p.c.cap,
            *(p.c[spec.name] for spec in SERIES),
        ]
        query = sa.select(*columns).join(s, s.c.id == p.c.series_id).order_by(p.c.build_order, p.c.id)
        if families is not None:
            query = query.where(s.c.family.in_(list(families)))
        out = []
        with self._read() as conn:
            for row in conn.execute(query):
                if row[7] not in VALIDITIES:
                    raise self._unknown(VALIDITIES, row[7], p, f"id={row[0]}")
                if type(row[3]) is not int or not _NUMBERS.issuperset(map(type, row[10:])):
                    raise self._not_a_number(row)
                out.append(
                    Point(
                        id=row[0],
                        family=row[1],
                        variant=row[2],
                        order=int(row[3]),
                        build=_build_label(row[4], row[5], int(row[3])),
                        method=row[6],
                        validity=row[7],
                        reason=row[8],
                        cap=row[9],
                        values={spec.name: row[10 + i] for i, spec in enumerate(SERIES)},
                    )
                )
        return out

    def _unknown(self, allowed: Sequence[str], value: object, table: sa.Table, row: str) -> TrackError:
        """A value outside its closed set (a point's validity, a build's status), as one line."""
        column = "validity" if table is points_table else "status"
        known = ", ".join(repr(v) for v in allowed)
        return damaged(self.where, table.name, row, f"{column} {_shown(value)} is not one of {known}")

    def _not_a_number(self, row: Sequence[Any]) -> TrackError:
        """The first cell of a point's row (as points() reads it) that is not a number: its build order
        or a series value (SQLite keeps whatever text a hand-edit gives a numeric column)."""
        if type(row[3]) is not int:
            said = f"build_order {_shown(row[3])} is not an integer"
        else:
            cells = zip(SERIES, row[10:], strict=True)
            said = next(
                f"{spec.name} {_shown(v)} is not a number" for spec, v in cells if type(v) not in _NUMBERS
            )
        return damaged(self.where, points_table.name, f"id={row[0]}", said)

    def _decode(self, text: object, shape: type[_T], table: sa.Table, row: str, column: str) -> _T:
        """A JSON cell as the shape this module wrote it in, or a TrackError naming table and row.
        Parsed by json (which reads the NaN that json.dumps writes), then shaped by msgspec."""
        try:
            return msgspec.convert(json.loads(str(text)), type=shape)
        except (ValueError, msgspec.ValidationError, RecursionError) as exc:
            said = f"{column} is not what itlaudit wrote ({_first_line(exc)})"
            raise damaged(self.where, table.name, row, said) from None

    def blind(self, builds: int) -> list[Blind]:
        """The families whose latest `builds` builds hold no valid point (changes.blind_families),
        read from the validity columns alone."""
        p, s = points_table, series_table
        query = sa.select(s.c.family, p.c.build_order, p.c.validity, p.c.reason, p.c.cap, p.c.id)
        with self._read() as conn:
            rows = conn.execute(query.join(s, s.c.id == p.c.series_id)).all()
        for row in rows:
            if row[2] not in VALIDITIES:
                raise self._unknown(VALIDITIES, row[2], p, f"id={row[5]}")
            if type(row[1]) is not int:
                raise damaged(
                    self.where, p.name, f"id={row[5]}", f"build_order {_shown(row[1])} is not an integer"
                )
        return blind_families((PointState(r[0], int(r[1]), r[2], r[3], r[4]) for r in rows), builds)

    def samples(self, ids: Sequence[int]) -> dict[int, Samples]:
        """Raw per-request figures of the given points."""
        if not ids:
            return {}
        p = points_table
        query = sa.select(p.c.id, p.c.samples).where(p.c.id.in_(list(ids)))
        with self._read() as conn:
            rows = conn.execute(query).all()
        shape = dict[str, list[float | None]]
        return {int(r[0]): self._decode(r[1], shape, p, f"id={r[0]}", "samples") for r in rows}

    def point_builds(self) -> dict[int, tuple[str | None, str | None, str | None, int, int]]:
        """Each point's commit, build flavour, run folder, requests and errors (what a dashboard's
        panel shows beside the series)."""
        p = points_table
        query = sa.select(p.c.id, p.c.build_commit, p.c.build_flavour, p.c.run_dir, p.c.requests, p.c.errors)
        with self._read() as conn:
            return {int(r[0]): (r[1], r[2], r[3], int(r[4]), int(r[5])) for r in conn.execute(query)}

    def fingerprints(self) -> dict[str, JSONObject]:
        """Each family's fingerprint (its series' fingerprint less the variant's name)."""
        s = series_table
        with self._read() as conn:
            rows = conn.execute(sa.select(s.c.family, s.c.fingerprint, s.c.id)).all()
        return {str(r[0]): self._decode(r[1], dict[str, Any], s, f"id={r[2]}", "fingerprint") for r in rows}

    def check(self, settings: CheckSettings | None = None) -> list[Change]:
        """Every change in the history, notes and bisections applied. Incremental: a family whose
        points are the ones its cached changes were found from (same count, same newest point, same
        settings) is read from the cache; only families with new points are searched again
        (changes.find_changes over their points). The cache is only ever derived: a row of it that
        does not read is searched again, and a cache that cannot be written is skipped. The cyclic
        garbage collector is paused meanwhile: a long history is 200,000 point objects without cycles,
        and the collector re-walked them on every burst of allocation (7.4 s → 4.2 s at 10,000 builds
        × 20 fingerprints)."""
        settings = settings or CheckSettings()
        enabled = gc.isenabled()
        gc.disable()
        try:
            changes = self._changes(settings)
        finally:
            if enabled:
                gc.enable()
        annotate(changes, self.notes(), {k: v["culprit"] for k, v in self.bisects().items()})
        return changes

    def _changes(self, settings: CheckSettings) -> list[Change]:
        p, s, c = points_table, series_table, check_cache_table
        settings_digest = digest(dataclasses.asdict(settings))
        count = sa.select(s.c.family, sa.func.count(p.c.id), sa.func.max(p.c.id))
        count = count.join(p, p.c.series_id == s.c.id).group_by(s.c.family)
        with self._read() as conn:
            signatures = {r[0]: f"{r[1]}:{r[2]}:{settings_digest}" for r in conn.execute(count)}
            cached = {
                row[0]: _cached_changes(row[2])
                for row in conn.execute(sa.select(c.c.family, c.c.signature, c.c.changes))
                if row[1] == signatures.get(row[0])
            }
        stale = sorted(f for f in signatures if cached.get(f) is None)
        found = find_changes(self.points(stale), self.samples, settings) if stale else []
        by_family: dict[str, list[Change]] = {f: [] for f in stale}
        for change in found:
            by_family[change.family].append(change)
        if stale:
            # The cache is only a saving: a history that will not take it (a read-only file, a lock
            # held past the busy timeout) still answers, from what was just searched.
            with suppress(TrackError), self._write(audit=False) as conn:
                rows = [
                    {
                        "family": f,
                        "signature": signatures[f],
                        "changes": json.dumps([x.to_json() for x in by_family[f]]),
                    }
                    for f in stale
                ]
                _upsert(conn, c, rows, ("family",))
        for family, changes in cached.items():
            if family not in by_family and changes is not None:
                by_family[family] = [Change.from_json(x) for x in changes]
        return [change for family in sorted(by_family) for change in by_family[family]]

    def notes(self) -> dict[str, str]:
        n = notes_table
        with self._read() as conn:
            return {row[0]: row[1] for row in conn.execute(sa.select(n.c.change_id, n.c.note))}

    def explain(self, change_id: str, note: str) -> None:
        with self._write() as conn:
            _upsert(
                conn, notes_table, [{"change_id": change_id, "note": note, "at": time.time()}], ("change_id",)
            )

    def commit_at(self, family: str, order: int) -> str | None:
        """The commit (or version) of a family's build at one position in first-parent order."""
        p, s = points_table, series_table
        query = (
            sa.select(p.c.build_commit, p.c.build_version)
            .join(s, s.c.id == p.c.series_id)
            .where(s.c.family == family, p.c.build_order == order)
            .limit(1)
        )
        with self._read() as conn:
            row = conn.execute(query).first()
        return None if row is None else (row[0] or row[1])

    def set_source(self, families: Iterable[str], settings: JSONMapping) -> None:
        """Remember how a family's builds are had (the nightly's provider and scenario) for bisecting."""
        text = json.dumps(dict(settings), sort_keys=True)
        rows = [{"family": family, "settings": text} for family in sorted(set(families))]
        if rows:
            with self._write() as conn:
                _upsert(conn, sources_table, rows, ("family",))

    def source(self, family: str) -> JSONObject | None:
        query = sa.select(sources_table.c.settings).where(sources_table.c.family == family)
        with self._read() as conn:
            found = conn.execute(query).scalar()
        return (
            None
            if found is None
            else self._decode(found, dict[str, Any], sources_table, f"family={family}", "settings")
        )

    def builds(self, source: str) -> dict[str, str]:
        """The builds a nightly source has already probed or skipped: {ref: status}."""
        b = builds_table
        query = sa.select(b.c.ref, b.c.status).where(b.c.source == source)
        with self._read() as conn:
            rows = conn.execute(query).all()
        for ref, status in rows:
            if status not in BUILD_STATUSES:
                raise self._unknown(BUILD_STATUSES, status, b, f"source={source} ref={ref}")
        return {ref: status for ref, status in rows}

    def mark_build(self, source: str, ref: str, order: int, status: str, reason: str | None) -> None:
        row = {
            "source": source,
            "ref": ref,
            "build_order": order,
            "status": status,
            "reason": reason,
            "at": time.time(),
        }
        with self._write() as conn:
            _upsert(conn, builds_table, [row], ("source", "ref"))

    def record_bisect(self, change_id: str, status: str, culprit: str | None, result: JSONMapping) -> None:
        """Write a bisection's answer onto a change (the last bisection of a change is the one kept)."""
        row = {
            "change_id": change_id,
            "status": status,
            "culprit": culprit,
            "result": json.dumps(dict(result), default=str),
            "at": time.time(),
        }
        with self._write() as conn:
            _upsert(conn, bisects_table, [row], ("change_id",))

    def bisects(self) -> dict[str, BisectRecord]:
        """Every change's bisection: {change id: {status, culprit, result}}."""
        b = bisects_table
        with self._read() as conn:
            rows = conn.execute(sa.select(b.c.change_id, b.c.status, b.c.culprit, b.c.result)).all()
        return {
            r[0]: BisectRecord(
                status=r[1],
                culprit=r[2],
                result=self._decode(r[3], dict[str, Any], b, f"change_id={r[0]}", "result"),
            )
            for r in rows
        }

    def close(self) -> None:
        self.engine.dispose()


_T = TypeVar("_T")
_WRITE = "itlaudit_write"  # the execution option that makes a SQLite transaction BEGIN IMMEDIATE
_MIGRATION_LOCK = 0x17A0D17  # PostgreSQL advisory lock key of a schema step: any constant of ours
BUSY_TIMEOUT_S = 60.0  # how long a SQLite writer waits for another's transaction before giving up
VALIDITIES = (VALID, LENGTH, CORRECTNESS, CLIENT)
_JSON_COLUMNS = (
    (series_table, "fingerprint"),
    (points_table, "samples"),
    (sources_table, "settings"),
    (bisects_table, "result"),
)
_INTEGER_COLUMNS = ("build_order", "requests", "errors")
_NUMBERS = frozenset((float, int, type(None)))  # what a series value may read as


_Audit = tuple[str, sa.ColumnElement[bool], str]  # a column, what marks it damaged, what that says


def _audits(dialect: str) -> dict[sa.Table, list[_Audit]]:
    """Per table, each column a write must not build on: the condition that marks its cell damaged,
    and what the one line says of it."""
    p, b = points_table, builds_table
    found: dict[sa.Table, list[_Audit]] = {
        p: [
            ("validity", p.c.validity.not_in(VALIDITIES), f"is not one of {', '.join(map(repr, VALIDITIES))}")
        ],
        b: [
            (
                "status",
                b.c.status.not_in(BUILD_STATUSES),
                f"is not one of {', '.join(map(repr, BUILD_STATUSES))}",
            )
        ],
    }
    if dialect != "sqlite":
        return found
    for table, name in _JSON_COLUMNS:
        # json.dumps writes NaN and Infinity, which SQLite's JSON1 (before 3.42) does not read: such a
        # text is left to the read, which parses it as json does.
        column = table.c[name]
        bad = sa.and_(
            sa.not_(sa.func.json_valid(column)), column.not_like("%NaN%"), column.not_like("%Infinity%")
        )
        found.setdefault(table, []).append((name, bad, "is not JSON"))
    found[p] += [
        (name, sa.func.typeof(p.c[name]) != "integer", "is not an integer") for name in _INTEGER_COLUMNS
    ]
    found[p] += [
        (spec.name, sa.func.typeof(p.c[spec.name]).not_in(("real", "integer", "null")), "is not a number")
        for spec in SERIES
    ]
    return found


def _row_name(keys: Sequence[sa.Column[Any]], row: Sequence[Any]) -> str:
    return " ".join(
        f"{column.name}={_shown(value)}" for column, value in zip(keys, row[: len(keys)], strict=True)
    )


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _said(exc: sa.exc.SQLAlchemyError) -> str:
    """What the database said (the driver's own first line, without SQLAlchemy's SQL and links)."""
    orig = exc.orig if isinstance(exc, sa.exc.DBAPIError) else None
    return _first_line(orig or exc)


def _shown(value: object) -> str:
    """A stored value as a message quotes it: its repr, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def damaged(where: str, table: str | None, row: str | None, what: str) -> TrackError:
    """The one line for a history that does not hold what itlaudit wrote: where, which table and row
    (where known), what is wrong, and that nothing was written into it."""
    at = ", ".join(
        part for part in (f"table {table}" if table else None, f"row {row}" if row else None) if part
    )
    return TrackError(
        f"{where}: {at + ': ' if at else ''}{what}; the history is damaged or was edited by hand, and "
        f"nothing was written to it: {'mend or delete that row, or ' if row else ''}restore it from a backup"
    )


def _cached_changes(text: str) -> list[ChangeJSON] | None:
    """A family's cached changes, or None when the cache row does not read (it is then searched again)."""
    try:
        return msgspec.convert(json.loads(text), type=list[ChangeJSON])
    except (ValueError, msgspec.ValidationError, RecursionError):
        return None


def _upsert(
    conn: sa.Connection, table: sa.Table, rows: Sequence[Mapping[str, Any]], keys: Sequence[str]
) -> None:
    """INSERT ... ON CONFLICT (keys) DO UPDATE: a row written twice, or by two writers at once, is the
    last one written (a delete-then-insert raced into a UNIQUE-constraint failure)."""
    insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
    statement = insert(table)
    update = {
        c.name: statement.excluded[c.name] for c in table.columns if c.name not in keys and not c.primary_key
    }
    conn.execute(statement.on_conflict_do_update(index_elements=list(keys), set_=update), list(rows))


def _sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
    """Each SQLite connection in WAL mode (readers never wait for a writer), its transactions begun by
    _sqlite_begin rather than by the driver."""
    dbapi_connection.isolation_level = None
    # A read-only file (a copy to publish from) cannot change its journal and is only read: as it is.
    with suppress(sqlite3.OperationalError):
        dbapi_connection.execute("PRAGMA journal_mode=WAL")


def _sqlite_begin(conn: sa.Connection) -> None:
    """BEGIN IMMEDIATE for a write: the write lock is taken (waiting up to the busy timeout) before the
    first read, so two writers queue rather than one failing when its read lock cannot be upgraded."""
    conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get(_WRITE) else "BEGIN")


def _engine(raw: str) -> sa.Engine:
    if not raw.startswith("sqlite"):
        return sa.create_engine(raw)
    engine = sa.create_engine(raw, connect_args={"timeout": BUSY_TIMEOUT_S})
    sa.event.listen(engine, "connect", _sqlite_connect)
    sa.event.listen(engine, "begin", _sqlite_begin)
    return engine


def _url(db: str) -> tuple[str, str]:
    """The SQLAlchemy URL for --db and how to name it in a message (a password never shown)."""
    if "://" in db:
        try:
            url = sa.engine.make_url(db)
        except (ValueError, sa.exc.ArgumentError) as exc:
            raise TrackError(
                f"--db {redact_url(db)}: not a history URL ({exc}); give a file path or "
                "postgresql://USER@HOST:PORT/DATABASE"
            ) from None
        if url.get_backend_name() not in ("postgresql", "sqlite"):
            raise TrackError(f"--db {url.render_as_string()}: give a file path or a postgresql:// URL")
        if url.get_backend_name() == "postgresql" and url.drivername == "postgresql":
            url = url.set(drivername="postgresql+psycopg")
        return url.render_as_string(hide_password=False), url.render_as_string(hide_password=True)
    path = Path(db).expanduser()
    if path.is_dir():
        raise TrackError(
            f"--db {db}: is a directory; give the history's file, e.g. {path / 'history.sqlite'}"
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TrackError(f"--db {db}: cannot create its folder ({exc.strerror})") from None
    return f"sqlite:///{path}", str(path)


def open_history(db: str | None) -> History:
    """Open (creating or upgrading) the history at a path or postgresql:// URL; None is DEFAULT_DB."""
    raw, shown = _url(db or str(DEFAULT_DB))
    try:
        history = History(_engine(raw), shown)
    except ModuleNotFoundError as exc:
        raise TrackError(
            f"--db {shown}: the PostgreSQL driver is missing ({exc.name}); pip install 'itlaudit[track-pg]'"
        ) from None
    except sa.exc.SQLAlchemyError as exc:
        raise TrackError(f"--db {shown}: cannot open the history ({_said(exc)})") from None
    try:
        history.migrate()
    except TrackError:
        history.close()
        raise
    return history
