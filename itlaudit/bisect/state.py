"""bisect.json: the bisection's whole memory, rewritten atomically after every step.

A probe is marked in progress (with its server's process group once one is up) before anything slow
happens, so a bisection killed at any point, even by SIGKILL, can be resumed: each marked probe (a
`--parallel` round has several) is rerun in a fresh folder (the partial one is kept, renamed), and a
server the dead run left behind is stopped. Each probe names its round: the probes of one round ran
at the same time.

A file read back for --resume is checked whole before anything is written, stopped or renamed: one cut
short, edited or copied from another bisection would otherwise steer the search by verdicts it never
gave, rename folders it names, or overwrite the evidence of what went wrong. The search never probes
outside the bounds the earlier rounds left, so replaying the rounds finds a verdict edited to
contradict them (a build good above one found bad).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Required, TypedDict

import msgspec

from itlaudit.bisect.build_range import Build
from itlaudit.bisect.search import Answer, Search
from itlaudit.bisect.settings import Settings
from itlaudit.errors import BisectError
from itlaudit.model.jsonvalue import JSONMapping, JSONObject
from itlaudit.model.vocabulary import Verdict

if TYPE_CHECKING:
    from itlaudit.bisect.figures import ProbeFigures

STATE_FILE = "bisect.json"
# 2: probes run every chosen variant; metrics are per variant. 3: `in_progress` is a list (a parallel
# round has several probes in flight) and probes carry their round. 4: `settings` typed in parts (the
# probe setup with the provider's own options, the capture options; settings.Settings.to_json); files
# of formats 2 and 3 are read as well (their flat settings through settings._upgrade).
FORMAT = 4
_READABLE = (2, 3, 4)
_STATUSES = ("running", "done", "failed")
_SHA_PREFIX = re.compile(r"[0-9a-f]{7,40}")
_PROBE_KEYS = {"index": int, "verdict": str, "label": str, "reason": str, "dir": str}
_PENDING_KEYS = {"index": int, "ref": str, "dir": str}


def answer(verdict: str, find_fix: bool) -> Answer:
    """What a verdict tells the search: bad is the regression's yes, good its no (the other way round
    when hunting the fix); skip and unknown tell it nothing."""
    if verdict not in (Verdict.GOOD, Verdict.BAD):
        return Answer.UNKNOWN
    return Answer.YES if (verdict == Verdict.GOOD) == find_fix else Answer.NO


class BisectResult(msgspec.Struct, kw_only=True):
    """The answer, as bisect.json's top-level keys beside `status`: a failed bisection has only its
    `message`; a finished one the range, the flipped signals and the explanation in figures. Fields
    absent from an older file read as unknown."""

    message: str | None = None
    first_bad: str | None = None  # None while more than one candidate is left
    last_good: str | None = None
    candidates: list[str] = msgspec.field(default_factory=list)
    compare_url: str | None = None
    signals: list[str] = msgspec.field(default_factory=list)
    explanation: str | None = None
    probes_used: int | None = None
    rounds_used: int | None = None
    elapsed_s: float | None = None


_RESULT_KEYS = BisectResult.__struct_fields__


class ProbeRecord(TypedDict, total=False):
    """One finished probe as bisect.json holds it (a dict because it IS the file's form; load checks
    the required keys, the rest are absent from older files)."""

    index: Required[int]
    label: Required[str]
    verdict: Required[str]
    reason: Required[str]
    dir: Required[str]
    build: str
    commit: str | None
    version: str | None
    trials: int
    metrics: dict[str, ProbeFigures]  # per variant
    detail: JSONMapping  # what the judge said, free-form per rule
    round: int
    gpu: str | None
    finished_at_unix: float
    node: str | None
    lost_nodes: list[str]


class PendingProbe(TypedDict, total=False):
    """A probe marked in progress: enough for resume to stop its server and set its folder aside."""

    index: Required[int]
    ref: Required[str]
    dir: Required[str]
    server_pgid: int
    server_argv: list[str]
    node: str


@dataclass
class State:
    settings: Settings
    builds: list[Build]
    probes: list[ProbeRecord] = field(default_factory=list)
    in_progress: list[PendingProbe] = field(default_factory=list)
    status: str = "running"
    result: BisectResult = field(default_factory=BisectResult)

    def to_json(self) -> JSONObject:
        return {
            "format": FORMAT,
            "status": self.status,
            **msgspec.to_builtins(self.result),
            "probes": self.probes,
            "in_progress": self.in_progress,
            "settings": self.settings.to_json(),
            "builds": [b.to_json() for b in self.builds],
        }

    @property
    def rounds(self) -> int:
        """Rounds so far: probes of one round share its number; a probe without one (format 2, one
        probe at a time) is a round of its own."""
        return len({p.get("round", -n) for n, p in enumerate(self.probes, 1)})

    def save(self, bisect_dir: Path) -> None:
        path = bisect_dir / STATE_FILE
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2, default=str) + "\n", encoding="utf-8")
        os.replace(tmp, path)


def load(bisect_dir: Path) -> State:
    """The bisection in `bisect_dir`, checked whole: any problem is one BisectError naming the file and
    what is wrong, raised before anything is touched."""
    path = bisect_dir / STATE_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BisectError(f"--resume {bisect_dir}: cannot read {STATE_FILE} ({exc})") from None
    if not isinstance(data, dict):
        raise _broken(path, f"holds a {type(data).__name__}, not a bisection")
    if data.get("format") not in _READABLE:
        raise BisectError(
            f"{path}: unknown format {data.get('format')!r}; it was written by another itlaudit"
        )
    for key in ("settings", "builds"):
        if key not in data:
            raise _broken(path, f"has no {key!r}")
    try:
        settings = Settings.from_json(data["settings"])
        builds = [Build.from_json(b) for b in data["builds"]]
    except BisectError as exc:
        raise _broken(path, f"its settings do not hold ({exc})") from None
    except (TypeError, KeyError, AttributeError) as exc:
        raise _broken(path, f"its settings or builds do not read ({type(exc).__name__}: {exc})") from None
    state = State(
        settings=settings,
        builds=builds,
        probes=data.get("probes", []),
        in_progress=_as_list(data.get("in_progress")),
        status=data.get("status", "running"),
        result=_result(path, data),
    )
    _check(state, bisect_dir)
    return state


def _result(path: Path, data: JSONObject) -> BisectResult:
    try:
        return msgspec.convert({k: data[k] for k in _RESULT_KEYS if k in data}, BisectResult)
    except msgspec.ValidationError as exc:
        raise _broken(path, f"has a result that does not read ({exc})") from None


def _broken(path: Path, problem: str) -> BisectError:
    return BisectError(
        f"{path} {problem}; it was cut short or edited, so --resume cannot trust it: restore it, or "
        "start the bisection again with a new --out"
    )


def _check(state: State, bisect_dir: Path) -> None:
    """Everything resume relies on: builds that are a range, probes and marked probes that name a build
    of it and a folder inside the bisection, verdicts the search knows, no build probed twice, and each
    round's probes inside the bounds the rounds before it left."""
    path = bisect_dir / STATE_FILE
    builds = state.builds
    kinds = {b.kind for b in builds}
    if len(builds) < 2 or not kinds <= {"commit", "version"} or len({b.ref for b in builds}) < len(builds):
        raise _broken(path, "has no range of two or more distinct builds")
    if state.status not in _STATUSES:
        raise _broken(path, f"has status {state.status!r} (known: {', '.join(_STATUSES)})")
    if not isinstance(state.probes, list):
        raise _broken(path, "has probes that are not a list")
    for what, records, keys, ref_key in (
        ("probe", state.probes, _PROBE_KEYS, "build"),
        ("probe in progress", state.in_progress, _PENDING_KEYS, "ref"),
    ):
        for n, record in enumerate(records, 1):
            if not isinstance(record, dict):
                raise _broken(path, f"has {what} {n} that is not an object")
            for key, kind in keys.items():
                if not isinstance(record.get(key), kind) or isinstance(record.get(key), bool):
                    raise _broken(path, f"has {what} {n} without {key!r} (a {kind.__name__})")
            index = record["index"]
            if not 0 <= index < len(builds):
                raise _broken(path, f"has {what} {n} at build {index}, outside the {len(builds)} builds")
            ref = record.get(ref_key)
            if ref is not None and ref != builds[index].ref:
                raise _broken(
                    path,
                    f"has {what} {n} of {ref}, not of build {index} ({builds[index].ref}): another range",
                )
            if Path(record["dir"]).parent.resolve() != bisect_dir.resolve():
                raise _broken(path, f"has {what} {n} whose folder {record['dir']} is not in {bisect_dir}")
    known = [str(v) for v in Verdict]
    seen: set[int] = set()
    for n, probe in enumerate(state.probes, 1):
        if probe["verdict"] not in known:
            raise _broken(
                path, f"has probe {n} with verdict {probe['verdict']!r} (known: {', '.join(known)})"
            )
        if probe["index"] in seen:
            raise _broken(path, f"has build {builds[probe['index']].label} probed twice")
        seen.add(probe["index"])
    _replay(state, path)


def _replay(state: State, path: Path) -> None:
    """Round by round, as the search chose them: a probe outside the bounds its earlier rounds left was
    never chosen by the search, so a verdict before it was edited (or it was)."""
    last = len(state.builds) - 1
    search = Search(len(state.builds))
    rounds: dict[int, list[ProbeRecord]] = {}
    for n, probe in enumerate(state.probes, 1):
        if probe["index"] not in (0, last):  # the ends are checked, not searched
            rounds.setdefault(probe.get("round", -n), []).append(probe)
    for probes in rounds.values():
        lo, hi = search.bounds
        for probe in probes:
            if not lo < probe["index"] < hi:
                no, yes = (
                    (Verdict.BAD, Verdict.GOOD) if state.settings.find_fix else (Verdict.GOOD, Verdict.BAD)
                )
                raise _broken(
                    path,
                    f"contradicts itself: probe of {probe['label']} ({probe['verdict']}) lies outside "
                    f"{state.builds[lo].label} ({no}) .. {state.builds[hi].label} ({yes}), where the probes "
                    "before it left the search: a verdict was changed",
                )
        for probe in probes:
            search.record(probe["index"], answer(probe["verdict"], state.settings.find_fix))


def same_build(given: str, stored: str) -> bool:
    """--from/--to as given against as stored: the same text, or one sha a prefix of the other."""
    a, b = given.strip().lower(), stored.strip().lower()
    shas = all(_SHA_PREFIX.fullmatch(x) for x in (a, b))
    return a == b or bool(shas and (a.startswith(b) or b.startswith(a)))


def _as_list(pending: list[PendingProbe] | PendingProbe | None) -> list[PendingProbe]:
    """Format 2 kept at most one probe in progress, as a dict or null."""
    if pending is None:
        return []
    return [pending] if isinstance(pending, dict) else list(pending)


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def stop_orphan(record: PendingProbe) -> bool:
    """Kill the server group a killed run left behind, but only if the pid still runs the argv we
    recorded: after a reboot or a long pause the pid may belong to someone else."""
    pgid, argv = record.get("server_pgid"), record.get("server_argv")
    if not pgid or not argv or cmdline(int(pgid))[: len(argv)] != argv:
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(int(pgid), signal.SIGKILL)
    return True


def set_aside(probe_dir: Path) -> Path | None:
    """Keep a cut-short probe's files under a new name (never lose data), freeing its folder."""
    if not probe_dir.exists():
        return None
    n = 1
    while probe_dir.with_name(f"{probe_dir.name}.interrupted-{n}").exists():
        n += 1
    target = probe_dir.with_name(f"{probe_dir.name}.interrupted-{n}")
    probe_dir.rename(target)
    return target
