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
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import sqlalchemy as sa

from itlaudit.errors import TrackError
from itlaudit.model.jsonvalue import JSONMapping, JSONObject
from itlaudit.track.changes import (
    SAMPLE_FIELDS,
    SERIES,
    SERVER_SERIES,
    Blind,
    Change,
    CheckSettings,
    Point,
    PointState,
    Samples,
    annotate,
    blind_families,
    find_changes,
    point_values,
)

__all__ = [
    "DEFAULT_DB",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "BisectRecord",
    "History",
    "NewPoint",
    "digest",
    "open_history",
]

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
    sa.Column("status", sa.String(16), nullable=False),  # PROBED or SKIPPED
    sa.Column("reason", sa.Text),
    sa.Column("at", sa.Float, nullable=False),
)
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
    """A connection to one history; every read and write goes through here."""

    def __init__(self, engine: sa.Engine, where: str) -> None:
        self.engine = engine
        self.where = where

    def migrate(self) -> None:
        """Create or upgrade the schema; refuse a history written by a newer itlaudit."""
        with self.engine.begin() as conn:
            _meta.create_all(conn, tables=[schema_table])
            current = conn.execute(sa.select(sa.func.max(schema_table.c.version))).scalar() or 0
            if current > SCHEMA_VERSION:
                raise TrackError(
                    f"{self.where}: history schema {current} is newer than this itlaudit's "
                    f"({SCHEMA_VERSION}); upgrade itlaudit"
                )
            for version in range(current + 1, SCHEMA_VERSION + 1):
                MIGRATIONS[version - 1](conn)
                conn.execute(sa.insert(schema_table).values(version=version))

    def schema_version(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.max(schema_table.c.version))).scalar() or 0)

    def add(self, points: Iterable[NewPoint]) -> int:
        """Record points; a point already recorded (same series, same run) is replaced, so adding a
        folder twice does not count it twice. Returns how many were written."""
        written = 0
        with self.engine.begin() as conn:
            series_ids: dict[str, int] = {}
            for point in points:
                key = point.series_key
                if key not in series_ids:
                    series_ids[key] = self._series_id(conn, point)
                sid = series_ids[key]
                conn.execute(
                    sa.delete(points_table).where(
                        points_table.c.series_id == sid, points_table.c.run_id == point.run_id
                    )
                )
                conn.execute(sa.insert(points_table).values(**self._row(point, sid)))
                written += 1
        return written

    def add_rows(self, points: Sequence[NewPoint]) -> None:
        """Bulk insert of new points (no replacement): for generated histories and the benchmark."""
        with self.engine.begin() as conn:
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
        key = point.series_key
        found = conn.execute(sa.select(series_table.c.id).where(series_table.c.key == key)).scalar()
        if found is not None:
            return int(found)
        result = conn.execute(
            sa.insert(series_table).values(
                key=key,
                family=point.family,
                variant=point.variant,
                fingerprint=json.dumps(dict(point.series_fingerprint), sort_keys=True),
            )
        )
        inserted = result.inserted_primary_key
        assert inserted is not None  # an insert of one row always has its key
        return int(inserted[0])

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
        with self.engine.connect() as conn:
            for row in conn.execute(query):
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

    def blind(self, builds: int) -> list[Blind]:
        """The families whose latest `builds` builds hold no valid point (changes.blind_families),
        read from the validity columns alone."""
        p, s = points_table, series_table
        query = sa.select(s.c.family, p.c.build_order, p.c.validity, p.c.reason, p.c.cap)
        with self.engine.connect() as conn:
            rows = conn.execute(query.join(s, s.c.id == p.c.series_id)).all()
        return blind_families((PointState(r[0], int(r[1]), r[2], r[3], r[4]) for r in rows), builds)

    def samples(self, ids: Sequence[int]) -> dict[int, Samples]:
        """Raw per-request figures of the given points."""
        if not ids:
            return {}
        query = sa.select(points_table.c.id, points_table.c.samples).where(points_table.c.id.in_(list(ids)))
        with self.engine.connect() as conn:
            return {int(row[0]): json.loads(row[1]) for row in conn.execute(query)}

    def check(self, settings: CheckSettings | None = None) -> list[Change]:
        """Every change in the history, notes and bisections applied. Incremental: a family whose
        points are the ones its cached changes were found from (same count, same newest point, same
        settings) is read from the cache; only families with new points are searched again
        (changes.find_changes over their points). The cyclic garbage collector is paused meanwhile: a
        long history is 200,000 point objects without cycles, and the collector re-walked them on every
        burst of allocation (7.4 s → 4.2 s at 10,000 builds × 20 fingerprints)."""
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
        with self.engine.connect() as conn:
            signatures = {row[0]: f"{row[1]}:{row[2]}:{settings_digest}" for row in conn.execute(count)}
            cached = {
                row[0]: (row[1], row[2])
                for row in conn.execute(sa.select(c.c.family, c.c.signature, c.c.changes))
            }
        stale = sorted(f for f, sig in signatures.items() if cached.get(f, ("", ""))[0] != sig)
        found = find_changes(self.points(stale), self.samples, settings) if stale else []
        by_family: dict[str, list[Change]] = {f: [] for f in stale}
        for change in found:
            by_family[change.family].append(change)
        if stale:
            with self.engine.begin() as conn:
                conn.execute(sa.delete(c).where(c.c.family.in_(stale)))
                conn.execute(
                    sa.insert(c),
                    [
                        {
                            "family": f,
                            "signature": signatures[f],
                            "changes": json.dumps([x.to_json() for x in by_family[f]]),
                        }
                        for f in stale
                    ],
                )
        for family in sorted(signatures):
            if family not in by_family:
                by_family[family] = [Change.from_json(x) for x in json.loads(cached[family][1])]
        return [change for family in sorted(by_family) for change in by_family[family]]

    def notes(self) -> dict[str, str]:
        with self.engine.connect() as conn:
            return {
                row[0]: row[1] for row in conn.execute(sa.select(notes_table.c.change_id, notes_table.c.note))
            }

    def explain(self, change_id: str, note: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(sa.delete(notes_table).where(notes_table.c.change_id == change_id))
            conn.execute(sa.insert(notes_table).values(change_id=change_id, note=note, at=time.time()))

    def commit_at(self, family: str, order: int) -> str | None:
        """The commit (or version) of a family's build at one position in first-parent order."""
        p, s = points_table, series_table
        query = (
            sa.select(p.c.build_commit, p.c.build_version)
            .join(s, s.c.id == p.c.series_id)
            .where(s.c.family == family, p.c.build_order == order)
            .limit(1)
        )
        with self.engine.connect() as conn:
            row = conn.execute(query).first()
        return None if row is None else (row[0] or row[1])

    def set_source(self, families: Iterable[str], settings: JSONMapping) -> None:
        """Remember how a family's builds are had (the nightly's provider and scenario) for bisecting."""
        text = json.dumps(dict(settings), sort_keys=True)
        with self.engine.begin() as conn:
            for family in sorted(set(families)):
                conn.execute(sa.delete(sources_table).where(sources_table.c.family == family))
                conn.execute(sa.insert(sources_table).values(family=family, settings=text))

    def source(self, family: str) -> JSONObject | None:
        query = sa.select(sources_table.c.settings).where(sources_table.c.family == family)
        with self.engine.connect() as conn:
            found = conn.execute(query).scalar()
        return None if found is None else dict(json.loads(found))

    def builds(self, source: str) -> dict[str, str]:
        """The builds a nightly source has already probed or skipped: {ref: status}."""
        query = sa.select(builds_table.c.ref, builds_table.c.status).where(builds_table.c.source == source)
        with self.engine.connect() as conn:
            return {row[0]: row[1] for row in conn.execute(query)}

    def mark_build(self, source: str, ref: str, order: int, status: str, reason: str | None) -> None:
        b = builds_table
        with self.engine.begin() as conn:
            conn.execute(sa.delete(b).where(b.c.source == source, b.c.ref == ref))
            conn.execute(
                sa.insert(b).values(
                    source=source, ref=ref, build_order=order, status=status, reason=reason, at=time.time()
                )
            )

    def record_bisect(self, change_id: str, status: str, culprit: str | None, result: JSONMapping) -> None:
        """Write a bisection's answer onto a change (the last bisection of a change is the one kept)."""
        b = bisects_table
        with self.engine.begin() as conn:
            conn.execute(sa.delete(b).where(b.c.change_id == change_id))
            conn.execute(
                sa.insert(b).values(
                    change_id=change_id,
                    status=status,
                    culprit=culprit,
                    result=json.dumps(dict(result), default=str),
                    at=time.time(),
                )
            )

    def bisects(self) -> dict[str, BisectRecord]:
        """Every change's bisection: {change id: {status, culprit, result}}."""
        b = bisects_table
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(b.c.change_id, b.c.status, b.c.culprit, b.c.result))
            return {r[0]: BisectRecord(status=r[1], culprit=r[2], result=json.loads(r[3])) for r in rows}

    def close(self) -> None:
        self.engine.dispose()


def _url(db: str) -> tuple[str, str]:
    """The SQLAlchemy URL for --db and how to name it in a message (a password never shown)."""
    if "://" in db:
        url = sa.engine.make_url(db)
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
        engine = sa.create_engine(raw)
        history = History(engine, shown)
        history.migrate()
    except ModuleNotFoundError as exc:
        raise TrackError(
            f"--db {shown}: the PostgreSQL driver is missing ({exc.name}); pip install 'itlaudit[track-pg]'"
        ) from None
    except sa.exc.SQLAlchemyError as exc:
        first = str(exc.orig if isinstance(exc, sa.exc.DBAPIError) else exc).strip().splitlines()[0]
        raise TrackError(f"--db {shown}: cannot open the history ({first})") from None
    return history
