"""`itlaudit track`: record finished run folders in a history and print its open changes.

Exit codes of `track check`: 0 no open regression (suspected changes may be listed), 1 at least one
confirmed regression is open, 2 bad input (a history that cannot be opened, a bad option).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from itlaudit.errors import ItlauditError

__all__ = ["track_app"]

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


def _fail(exc: ItlauditError) -> typer.Exit:
    err.print(escape(str(exc)), highlight=False)
    return typer.Exit(exc.exit_code)


@track_app.command("add")
def add(
    run_dirs: Annotated[list[Path], typer.Argument(metavar="RUN_DIR...", help="Finished run folders.")],
    db: DbOption = None,
    order: Annotated[
        int | None,
        typer.Option(metavar="N", help="Build position: git rev-list --first-parent --count SHA."),
    ] = None,
    version: Annotated[str | None, typer.Option(metavar="V", help="The build's version.")] = None,
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
    min_effect: Annotated[
        float, typer.Option(metavar="F", help="Smallest relative move that counts (0.1 = 10 %).")
    ] = 0.10,
) -> None:
    """Print the open changes of the history; exit 1 when a confirmed regression is open."""
    from itlaudit.track.changes import SUSPECTED, CheckSettings, open_changes
    from itlaudit.track.db import open_history

    if not 0 < min_effect < 10:
        raise _fail(ItlauditError(f"--min-effect {min_effect}: give a fraction such as 0.1 (10 %)"))
    try:
        history = open_history(db)
        changes = history.check(CheckSettings(min_effect=min_effect))
        history.close()
    except ItlauditError as exc:
        raise _fail(exc) from None
    still_open = open_changes(changes)
    suspected = [c for c in changes if c.state == SUSPECTED]
    if as_json:
        out.print_json(json.dumps([c.to_json() for c in changes]))
    else:
        shown = changes if show_all else [*still_open, *suspected]
        for change in shown:
            where = f" (last good {change.last_good_build})" if change.last_good_build else ""
            closed = f", closed by {change.closed_by}" if change.closed_by else ""
            out.print(
                f"{change.id} [{change.state}, {change.change_class}, {change.kind}{closed}] "
                f"{change.summary}{where}",
                markup=False,
            )
        out.print(
            f"{len(still_open)} open regression(s), {len(suspected)} suspected, "
            f"{len(changes)} change(s) in {history.where}"
        )
    if still_open:
        raise typer.Exit(1)


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
        Path, typer.Argument(metavar="OUT", help="The site's folder (new, empty, or an earlier publish).")
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
