"""`itlaudit track`: record finished run folders in a history and print its open changes; probe
nightlies into it and bisect its changes (track/nightly.py).

Exit codes of `track check` and `track nightly`, as `git bisect run` reads a script's: 0 no open
regression (suspected changes may be listed), 1 at least one confirmed regression is open, 2 bad
input (a history that cannot be opened, a bad option), 125 cannot tell: a family's latest builds hold
no valid point (all capped, failing, or gibberish where their baseline is clean), or (`nightly`) there
were new builds and none of them could be probed.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from itlaudit.bisect.settings import ProbeSetup
from itlaudit.cli.options import with_options
from itlaudit.cli.probe_setup import probe_setup_options
from itlaudit.errors import ItlauditError

if TYPE_CHECKING:
    from itlaudit.analysis.changes import Blind, Change, CheckSettings

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

track_app = typer.Typer(
    no_args_is_help=True,
    help="A history of builds: record run folders, find and classify change points.",
)

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        metavar="PATH|URL",
        help="The history: a SQLite file (default ~/.cache/itlaudit/history.sqlite) or postgresql://...",
    ),
]


ThresholdOption = Annotated[
    float,
    typer.Option(
        metavar="R",
        help="Smallest ratio of medians that counts (1.1 = 10 %), as diff's and bisect's --threshold.",
    ),
]


def _fail(exc: ItlauditError) -> typer.Exit:
    err.print(escape(str(exc)), highlight=False)
    return typer.Exit(exc.exit_code)


def _min_effect(threshold: float) -> float:
    """--threshold R (a ratio, as diff's and bisect's) as the relative move a change must make."""
    if not 1 < threshold < 11:
        raise _fail(ItlauditError(f"--threshold {threshold}: give a ratio above 1, such as 1.1 (10 %)"))
    return threshold - 1


@track_app.command("add")
def add(
    run_dirs: Annotated[list[Path], typer.Argument(metavar="RUN_DIR...", help="Finished run folders.")],
    db: DbOption = None,
    order: Annotated[
        int | None,
        typer.Option(metavar="N", help="Build position: git rev-list --first-parent --count SHA."),
    ] = None,
    version: Annotated[
        str | None, typer.Option("--build-version", metavar="V", help="The build's version.")
    ] = None,
    commit: Annotated[str | None, typer.Option(metavar="SHA", help="The build's commit.")] = None,
    flavour: Annotated[str | None, typer.Option(metavar="NAME", help="Build variant: cu130, cpu.")] = None,
) -> None:
    """Record finished run folders (run, compare, sweep trials) as points, one per variant."""
    from itlaudit.track.record import BuildInfo, record

    try:
        build = BuildInfo(order=order, version=version, commit=commit, flavour=flavour)
        written, folders, where = record(db, run_dirs, build)
    except ItlauditError as exc:
        raise _fail(exc) from None
    out.print(f"recorded {written} points from {folders} run folder(s) in {where}")


@track_app.command("check")
def check(
    db: DbOption = None,
    show_all: Annotated[bool, typer.Option("--all", help="Closed and explained changes too.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="The changes as JSON on stdout.")] = False,
    threshold: ThresholdOption = 1.10,
    auto: Annotated[
        bool,
        typer.Option(
            "--auto", help="Bisect each confirmed regression not bisected yet (builds from track nightly)."
        ),
    ] = False,
) -> None:
    """Print the open changes of the history; exit 1 when a confirmed regression is open."""
    from itlaudit.analysis.changes import CheckSettings, open_changes
    from itlaudit.track.db import open_history
    from itlaudit.track.nightly import EXIT_CANNOT_TELL, EXIT_REGRESSION

    settings = CheckSettings(min_effect=_min_effect(threshold))
    try:
        history = open_history(db)
        try:
            changes = history.check(settings)
            blind = history.blind(settings.blind_builds)
        finally:
            history.close()
    except ItlauditError as exc:
        raise _fail(exc) from None
    if auto:
        changes = _bisect_open(db, changes, settings)
    _print_changes(changes, show_all=show_all, as_json=as_json, where=history.where, blind=blind)
    if open_changes(changes):
        raise typer.Exit(EXIT_REGRESSION)
    if blind:
        raise typer.Exit(EXIT_CANNOT_TELL)


def _bisect_open(db: str | None, changes: list[Change], settings: CheckSettings) -> list[Change]:
    """--auto: bisect the regressions without a bisection; the changes as the probes left them."""
    from itlaudit.track.db import open_history
    from itlaudit.track.nightly import bisect_unexplained

    history = open_history(db)
    try:
        for change_id, answer in bisect_unexplained(history, changes, err, settings).items():
            said = answer.get("message") or ""
            out.print(f"{change_id}: bisect: {answer.get('culprit') or 'no culprit'} ({said})", markup=False)
        return history.check(settings)
    except ItlauditError as exc:
        raise _fail(exc) from None
    finally:
        history.close()


def _print_changes(
    changes: list[Change], *, show_all: bool, as_json: bool, where: str, blind: list[Blind]
) -> None:
    """The changes (all, or the open and suspected ones), then the families nothing could be told
    about, then the count line; --json prints the changes alone on stdout and the rest on stderr."""
    from itlaudit.analysis.changes import SUSPECTED, open_changes

    still_open = open_changes(changes)
    suspected = [c for c in changes if c.state == SUSPECTED]
    for family in blind:
        (err if as_json else out).print(family.sentence, markup=False)
    if as_json:
        out.print_json(json.dumps([c.to_json() for c in changes]))
    else:
        shown = changes if show_all else [*still_open, *suspected]
        for change in shown:
            good = f" (last good {change.last_good_build})" if change.last_good_build else ""
            closed = f", closed by {change.closed_by}" if change.closed_by else ""
            out.print(
                f"{change.id} [{change.state}, {change.change_class}, {change.kind}{closed}] "
                f"{change.summary}{good}",
                markup=False,
            )
        out.print(
            f"{len(still_open)} open regression(s), {len(suspected)} suspected, "
            f"{len(changes)} change(s) in {where}"
        )


def _one_line_errors(command: Callable[..., None]) -> Callable[..., None]:
    """A command whose option groups check what they are given (ProbeSetup's): their error is the
    command's one line and exit code, as one raised in its body is."""

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> None:
        try:
            command(**kwargs)
        except ItlauditError as exc:
            raise _fail(exc) from None

    return wrapper


@track_app.command("nightly")
@_one_line_errors
@with_options("setup", probe_setup_options)
def nightly(
    db: DbOption = None,
    since: Annotated[
        str | None, typer.Option(metavar="DATE", help="Builds from this day on (commit date; a clone).")
    ] = None,
    last: Annotated[int | None, typer.Option(metavar="N", help="The newest N builds.")] = None,
    every_commit: Annotated[
        bool, typer.Option("--every-commit", help="Every first-parent commit, not one per day.")
    ] = False,
    auto: Annotated[bool, typer.Option("--auto", help="Bisect each confirmed regression found.")] = False,
    out_dir: Annotated[
        Path | None,
        typer.Option("--out", metavar="DIR", help="Probe folders (default reports/track-nightly-...)."),
    ] = None,
    threshold: ThresholdOption = 1.10,
    *,
    setup: ProbeSetup,
) -> None:
    """Probe each new build once, record it, check; exit 1 on a confirmed regression (125: none probed)."""
    from itlaudit.analysis.changes import CheckSettings
    from itlaudit.store.rundir import DEFAULT_REPORTS, new_run_dir
    from itlaudit.track.db import open_history
    from itlaudit.track.nightly import bisect_unexplained, nightly_builds
    from itlaudit.track.nightly import nightly as run_nightly

    min_effect = _min_effect(threshold)
    builds = nightly_builds(setup, since=since, last=last, every_commit=every_commit)
    history = open_history(db)
    try:
        folder = out_dir or new_run_dir(DEFAULT_REPORTS, "track-nightly")
        check = CheckSettings(min_effect=min_effect)
        result = run_nightly(history, setup, builds, folder, err, check)
        if auto:
            for change_id, answer in bisect_unexplained(history, result.changes, err, check).items():
                said = answer.get("message") or ""
                out.print(
                    f"{change_id}: bisect: {answer.get('culprit') or 'no culprit'} ({said})", markup=False
                )
            result.changes = history.check(check)
    finally:
        history.close()
    out.print(f"nightly: {len(result.probed)} build(s) probed, {len(result.skipped)} skipped", markup=False)
    _print_changes(result.changes, show_all=True, as_json=False, where=history.where, blind=result.blind)
    raise typer.Exit(result.exit_code)


@track_app.command("bisect")
def bisect(
    change_id: Annotated[str, typer.Argument(metavar="CHANGE", help="A change's id from `track check`.")],
    db: DbOption = None,
    out_dir: Annotated[
        Path | None,
        typer.Option("--out", metavar="DIR", help="Bisection folder (default beside the nightly's)."),
    ] = None,
) -> None:
    """Bisect a change between its last good and first bad build, with the verdict its class calls for;
    every probe goes into the history and the culprit onto the change."""
    from itlaudit.track.db import open_history
    from itlaudit.track.nightly import bisect_change

    try:
        history = open_history(db)
        try:
            change = next((c for c in history.check() if c.id == change_id), None)
            if change is None:
                raise ItlauditError(
                    f"{change_id}: no such change in {history.where}; see `itlaudit track check --all`"
                )
            answer = bisect_change(history, change, err, out_dir=out_dir)
        finally:
            history.close()
    except ItlauditError as exc:
        raise _fail(exc) from None
    out.print(f"{change_id}: {answer.get('message')}", markup=False)
    out.print(f"culprit: {answer.get('culprit') or 'none found'}; folder {answer['dir']}", markup=False)


@track_app.command("explain")
def explain(
    change_id: Annotated[str, typer.Argument(metavar="CHANGE", help="A change's id from `track check`.")],
    note: Annotated[str, typer.Argument(metavar="TEXT", help="Why it happened (a PR, an intended change).")],
    db: DbOption = None,
) -> None:
    """Mark a change explained: it stays in the history and stops counting as open."""
    from itlaudit.track.db import open_history

    try:
        history = open_history(db)
        history.explain(change_id, note)
        history.close()
    except ItlauditError as exc:
        raise _fail(exc) from None
    out.print(f"{change_id}: explained")


@track_app.command("publish")
def publish(
    out_dir: Annotated[
        Path,
        typer.Option("--out", metavar="DIR", help="The site's folder (new, empty, or an earlier publish)."),
    ],
    db: DbOption = None,
    github_repo: Annotated[
        str,
        typer.Option(metavar="OWNER/NAME", help="Where the commit links point, as bisect's --github-repo."),
    ] = "vllm-project/vllm",
    sample_builds: Annotated[
        int,
        typer.Option(
            metavar="N",
            help="Newest builds whose per-request samples the pages carry (and those around each change).",
        ),
    ] = 500,
) -> None:
    """Write a static dashboard (index, one page per fingerprint) that opens from disk, no network."""
    from itlaudit.track.db import open_history
    from itlaudit.track.publish import publish as write_site

    if sample_builds < 0:
        raise _fail(ItlauditError(f"--sample-builds {sample_builds}: give 0 or more builds"))
    try:
        history = open_history(db)
        try:
            done = write_site(history, out_dir, github_repo=github_repo, sample_builds=sample_builds)
        finally:
            history.close()
    except ItlauditError as exc:
        raise _fail(exc) from None
    out.print(
        f"published {done.pages} fingerprint page(s), {done.changes} change(s): {done.index}", markup=False
    )
