"""`track nightly` and `track bisect`: the history fed and its changes bisected by the bisect's own
providers, probes and search, never a copy of them.

A nightly probes each build the history has not seen yet, once, through a bisect provider (wheels,
docker, pip, command) with a bundled scenario (the seed's K0/K3 long decode by default), records its
trial folders as points, and checks. A build is a nightly: with a git clone, the newest first-parent
commit of each UTC day (`--every-commit`: every first-parent commit); with a commits file, each
listed commit; with the pip provider, each released version. Its position in first-parent order is
the build's order in the history, so missing nightlies are gaps and the commits a bisection probes
between two nightlies fall where they belong.

Bisecting a change runs `Bisection` between the commits of its last good and first bad build, with
the verdict its class calls for (truncation for a cap, itl for a speed, speedup for a lost K3/K0
speedup) and a threshold halfway to the move the history saw. Every probe is recorded back into the
history (so the change then sits at the culprit itself) and the answer is written onto the change.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec
from rich.console import Console

from itlaudit.analysis.changes import (
    CONFIRMED,
    LENGTH_CAP,
    REGRESSION,
    SPEED,
    SPEEDUP_CLASS,
    Blind,
    Change,
    CheckSettings,
    open_changes,
)
from itlaudit.bisect.bisector import Bisection, probe_config, probe_scenario
from itlaudit.bisect.build_range import Build, fetch_versions
from itlaudit.bisect.prefetch import Prefetcher
from itlaudit.bisect.probe import run_probe
from itlaudit.bisect.providers.pip import PipOptions
from itlaudit.bisect.settings import ProbeSetup, Settings, list_builds, make_provider
from itlaudit.bisect.state import State
from itlaudit.bisect.verdict import TruncationJudge, parse_regress
from itlaudit.errors import BisectError, TrackError
from itlaudit.model.jsonvalue import JSONObject
from itlaudit.model.vocabulary import Verdict
from itlaudit.store.rundir import META_FILE, REQUESTS_FILE, write_meta
from itlaudit.track.db import FAILED, PROBED, SKIPPED, History, NewPoint, digest
from itlaudit.track.record import BuildInfo, run_points

# `track nightly` and `track check` exit codes, as `git bisect run` reads a script's: 0 good, 1 bad (a
# confirmed regression is open), 125 cannot tell (there were new builds and none could be probed, or a
# family's latest builds hold no valid point: nothing was tested); 2 is bad input.
EXIT_REGRESSION = 1
EXIT_CANNOT_TELL = 125
# The bisect verdict each change class is bisected with; other classes are not a build's doing alone.
_VERDICT = {LENGTH_CAP: "truncation", SPEED: "itl", SPEEDUP_CLASS: "speedup"}


@dataclass(frozen=True)
class NightlyBuild:
    """One build to probe: what the provider consumes and its position in first-parent order."""

    build: Build
    order: int


@dataclass
class NightlyResult:
    probed: list[str] = dataclasses.field(default_factory=list)
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)
    changes: list[Change] = dataclasses.field(default_factory=list)
    bisected: dict[str, str | None] = dataclasses.field(default_factory=dict)
    blind: list[Blind] = dataclasses.field(default_factory=list)

    @property
    def exit_code(self) -> int:
        if open_changes(self.changes):
            return EXIT_REGRESSION
        if (self.skipped and not self.probed) or self.blind:
            return EXIT_CANNOT_TELL
        return 0


def source_key(setup: ProbeSetup) -> str:
    """What makes two nightlies the same source of builds: the probe setup (provider, its options,
    scenario, variants, build and server commands). A history recorded before bisect.json's format 4
    keyed its sources by the flat settings, so its builds are probed again once under the new key."""
    return digest(setup.to_json())


def _probe_settings(setup: ProbeSetup) -> Settings:
    """A nightly's probe runs each variant once; its verdict is not used (truncation needs one pass)."""
    return Settings(good="", bad="", setup=setup, regress=TruncationJudge())


def _git(repo: str, *args: str) -> list[str]:
    try:
        done = subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True, check=False)
    except OSError as exc:
        raise TrackError(f"cannot run git ({exc}); install git or give --commits-file") from None
    if done.returncode != 0:
        raise TrackError(f"--repo {repo}: git {args[0]} failed ({done.stderr.strip() or 'no output'})")
    return done.stdout.split("\n")


def _first_parent_orders(repo: str) -> dict[str, int]:
    """Each first-parent commit of HEAD with its position (1 is the root): the build order."""
    shas = [line for line in _git(repo, "rev-list", "--first-parent", "--reverse", "HEAD") if line]
    return {sha: n for n, sha in enumerate(shas, 1)}


def _since(text: str) -> dt.datetime:
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise TrackError(f"--since {text}: give a date such as 2026-11-01") from None
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


def nightly_builds(
    setup: ProbeSetup, *, since: str | None, last: int | None, every_commit: bool = False
) -> list[NightlyBuild]:
    """The builds in range, oldest first, each with its order (see the module's docstring)."""
    if (since is None) == (last is None):
        raise TrackError("give --since DATE or --last N (one of them)")
    if last is not None and last < 1:
        raise TrackError(f"--last {last}: give 1 or more builds")
    if isinstance(setup.provider, PipOptions):
        if since is not None:
            raise TrackError("--since needs commit dates; with --provider pip give --last N")
        versions = fetch_versions(setup.provider.package, setup.provider.index_url)
        listed = [NightlyBuild(Build(str(v), "version"), n) for n, v in enumerate(versions, 1)]
        return listed[-(last or 0) :]
    if setup.commits_file:
        if since is not None:
            raise TrackError("--since needs commit dates; with --commits-file give --last N")
        try:
            text = Path(setup.commits_file).read_text(encoding="utf-8")
        except OSError as exc:
            raise TrackError(
                f"--commits-file {setup.commits_file}: cannot read it ({exc.strerror})"
            ) from None
        shas = [ln.split()[0] for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
        listed = [NightlyBuild(Build(sha, "commit"), n) for n, sha in enumerate(shas, 1)]
        return listed[-(last or 0) :]
    if not setup.repo:
        raise TrackError("give the builds' source: --repo CLONE, --commits-file FILE or --provider pip")
    orders = _first_parent_orders(setup.repo)
    log = [ln.split() for ln in _git(setup.repo, "log", "--first-parent", "--format=%H %ct") if ln]
    dated = [(sha, dt.datetime.fromtimestamp(int(ts), dt.UTC)) for sha, ts in reversed(log)]
    if not every_commit:  # a nightly: the day's newest first-parent commit
        newest: dict[dt.date, tuple[str, dt.datetime]] = {}
        for sha, when in dated:
            newest[when.date()] = (sha, when)
        dated = list(newest.values())
    if since is not None:
        start = _since(since)
        dated = [(sha, when) for sha, when in dated if when >= start]
    elif last is not None:
        dated = dated[-last:]
    return [NightlyBuild(Build(sha, "commit"), orders[sha]) for sha, _ in dated]


def probe_points(
    probe_dir: Path, settings: Settings, order: int, ref: str, version: str | None
) -> list[NewPoint]:
    """A probe's trial folders as points of the history, read by record.run_points as it reads a run,
    the build (its order and commit) given here. A trial folder without a meta.json gets one naming
    the scenario and its variants, so it can be fingerprinted."""
    scenario, _ = probe_scenario(settings)
    by_version = settings.setup.by_version
    points = []
    for trial in sorted(probe_dir.glob("trial-*")):
        if not (trial / REQUESTS_FILE).is_file():
            continue
        commit = ref if not by_version else None
        if not (trial / META_FILE).is_file():  # a probe folder from before probes wrote their meta.json
            write_meta(
                trial,
                {
                    "scenario_path": settings.setup.scenario,
                    "variants": {v.name: {} for v in scenario.variants},
                    "metadata": {"build_order": order, **({"commit": commit} if commit else {})},
                },
            )
        build = BuildInfo(order=order, version=version or (ref if by_version else None), commit=commit)
        points += run_points(trial, build)
    return points


def nightly(
    history: History,
    setup: ProbeSetup,
    builds: Sequence[NightlyBuild],
    out_dir: Path,
    console: Console,
    check: CheckSettings | None = None,
) -> NightlyResult:
    """Probe each build the history has not seen from this source, record it, and check."""
    source = source_key(setup)
    seen = history.builds(source)
    new = [b for b in builds if b.build.ref not in seen]
    result = NightlyResult()
    settings = _probe_settings(setup)
    config = dataclasses.replace(
        probe_config(settings, max_trials=settings.effective_trials),
        finish_with="`itlaudit track nightly` run again with the same options, which probes this build again",
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    provider, _ = make_provider(setup, out_dir)
    prefetcher = Prefetcher(provider, background=False)
    console.print(
        f"nightly: {len(new)} new build(s) of {len(builds)} in range; {len(builds) - len(new)} already in "
        f"{history.where}",
        markup=False,
    )
    families: set[str] = set()
    try:
        for item in new:
            probe_dir = out_dir / f"build-{item.order:06d}-{item.build.label}"
            probe = run_probe(config, prefetcher, item.build, probe_dir, None, lambda _pgid: None)
            points = probe_points(probe_dir, settings, item.order, item.build.ref, probe.version)
            if probe.verdict == Verdict.SKIP or not points:
                status = SKIPPED if probe.verdict == Verdict.SKIP else FAILED
                result.skipped[item.build.ref] = probe.reason
                history.mark_build(source, item.build.ref, item.order, status, probe.reason)
                console.print(f"  {item.build.label} (#{item.order}): {status}: {probe.reason}", markup=False)
                continue
            history.add(points)
            families.update(p.family for p in points)
            history.mark_build(source, item.build.ref, item.order, PROBED, None)
            result.probed.append(item.build.ref)
            console.print(
                f"  {item.build.label} (#{item.order}): recorded {len(points)} point(s)", markup=False
            )
    finally:
        prefetcher.close()
    history.set_source(families, {**setup.to_json(), "out_dir": str(out_dir)})
    result.changes = history.check(check)
    result.blind = history.blind((check or CheckSettings()).blind_builds)
    return result


def _threshold(change: Change) -> float:
    """Halfway (as a ratio) to the smallest move of token ITL or speedup the history saw, so the
    bisect tells the good and bad builds apart by the step itself, not by its default 1.5×."""
    ratios = [
        e.ratio for e in change.evidence if e.ratio and e.ratio > 0 and e.series in ("itl_p50", "speedup")
    ]
    if not ratios:
        return 1.5
    smallest = min(max(r, 1 / r) for r in ratios)
    return max(1.0 + (smallest - 1.0) / 2, 1.05)


def _variants(change: Change, setup: ProbeSetup, base: str) -> tuple[str, ...]:
    """A lost speedup is judged on the base and the variant that lost it; anything else runs every
    variant the nightly ran, so each of the family's series gets the probed builds and the change
    moves onto the culprit whole (not K0 at the culprit and K3 still at the nightly)."""
    if change.change_class == SPEEDUP_CLASS:
        lost = next(e.variant for e in change.evidence if e.series == "speedup")
        return (base, lost)
    return setup.variants


def bisect_change(
    history: History,
    change: Change,
    console: Console,
    *,
    out_dir: Path | None = None,
    check: CheckSettings | None = None,
) -> JSONObject:
    """Bisect one change between its last good and first bad build; record every probe; write the
    answer onto the change. Returns the bisection's result (bisect.json's answer)."""
    verdict = _VERDICT.get(change.change_class)
    if verdict is None or change.kind != REGRESSION:
        raise TrackError(
            f"{change.id}: a {change.change_class} {change.kind} is not bisected (bisect a length/cap, "
            "speed or speedup regression)"
        )
    template: JSONObject = dict(history.source(change.family) or {})
    if not template:
        raise TrackError(
            f"{change.id}: its builds were not probed by `track nightly`, so how to get them is unknown; "
            "record them with `track nightly` or bisect with `itlaudit bisect --from A --to B`"
        )
    if change.last_good_order is None:
        raise TrackError(f"{change.id}: no build before it in the history; nothing to bisect against")
    good = history.commit_at(change.family, change.last_good_order)
    bad = history.commit_at(change.family, change.order)
    if not good or not bad:
        raise TrackError(f"{change.id}: its builds carry no commit or version; record them with --commit")
    folder = out_dir or Path(str(template.pop("out_dir", "."))) / f"bisect-{change.id}"
    template.pop("out_dir", None)
    timing = verdict != "truncation"
    try:
        setup = ProbeSetup.from_json(template)  # as the nightly probed (an older history's too)
        variants = _variants(change, setup, (check or CheckSettings()).base_variant)
        settings = Settings(
            good=good,
            bad=bad,
            setup=msgspec.structs.replace(setup, variants=variants),
            regress=parse_regress(verdict),
            threshold=_threshold(change) if timing else 1.5,
            trials=2 if timing else None,
            max_trials=4 if timing else 1,
        )
        builds = list_builds(settings)
        folder.mkdir(parents=True, exist_ok=True)
        state = State(settings=settings, builds=builds)
        state.save(folder)
        console.print(
            f"bisect {change.id} ({change.change_class}): {len(builds)} builds "
            f"{builds[0].label}..{builds[-1].label}, --regress {verdict}; folder {folder}",
            markup=False,
        )
        done = Bisection.assemble(state, folder, console).run()
    except BisectError as exc:
        history.record_bisect(change.id, "failed", None, {"message": str(exc), "dir": str(folder)})
        raise TrackError(f"{change.id}: bisect failed: {exc}") from None
    _record_probes(history, done, folder)
    answer: JSONObject = msgspec.to_builtins(done.result)
    first_bad, candidates = answer.get("first_bad"), answer.get("candidates")
    culprit = (
        first_bad
        if isinstance(first_bad, str) and first_bad
        else f"one of {', '.join(str(c)[:9] for c in candidates)}"
        if isinstance(candidates, list) and candidates
        else None
    )
    history.record_bisect(change.id, done.status, culprit, {**answer, "dir": str(folder)})
    # The probes put the change at the culprit itself: the answer goes onto that change too.
    for moved in history.check(check):
        if (
            moved.family == change.family
            and moved.change_class == change.change_class
            and moved.kind == change.kind
            and change.last_good_order < moved.order <= change.order
            and moved.id != change.id
        ):
            history.record_bisect(moved.id, done.status, culprit, {**answer, "dir": str(folder)})
    return {**answer, "culprit": culprit, "dir": str(folder)}


def _record_probes(history: History, state: State, folder: Path) -> None:
    """Each probe's trials as points at the probed build's first-parent order (with a clone; in a
    commits file, its line; the ends keep the orders the history has for them)."""
    settings = state.settings
    orders: Mapping[str, int]
    if settings.setup.repo:
        orders = _first_parent_orders(settings.setup.repo)
    else:
        listed = nightly_builds(settings.setup, since=None, last=10**9, every_commit=True)
        orders = {b.build.ref: b.order for b in listed}
    points = []
    for probe in state.probes:
        ref = state.builds[probe["index"]].ref
        if probe["verdict"] == Verdict.SKIP or ref not in orders:
            continue
        points += probe_points(Path(probe["dir"]), settings, orders[ref], ref, probe.get("version"))
    history.add(points)


def bisect_unexplained(
    history: History, changes: Sequence[Change], console: Console, check: CheckSettings | None = None
) -> dict[str, JSONObject]:
    """`--auto`: bisect each confirmed regression of a bisectable class that has no bisection yet
    (closed ones too: a cap that came and went still has a culprit). Returns {change id: answer}; a
    bisection that could not run is its one-line message."""
    known = history.bisects()
    wanted = [
        c
        for c in changes
        if c.kind == REGRESSION and c.state == CONFIRMED and c.change_class in _VERDICT and c.id not in known
    ]
    found: dict[str, JSONObject] = {}
    for change in wanted:
        started = time.monotonic()
        try:
            found[change.id] = bisect_change(history, change, console, check=check)
        except TrackError as exc:
            found[change.id] = {"culprit": None, "message": str(exc)}
        found[change.id]["elapsed_s"] = round(time.monotonic() - started, 1)
    return found
