"""`itlaudit bisect`: options in, one Bisection run, the answer (or the resume command) out."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from itlaudit.bisect.settings import ProbeSetup, Settings
from itlaudit.bisect.verdict import JUDGES, parse_regress
from itlaudit.capture.runner import CaptureOptions
from itlaudit.cli.options import (
    MAX_TRIALS_HELP,
    TRIALS_HELP,
    cluster_option,
    parse_cluster,
    trial_capture_options,
    with_options,
)
from itlaudit.cli.probe_setup import GENERAL, PROVIDER, probe_setup_options
from itlaudit.errors import BisectError, RunInterrupted
from itlaudit.model.stop import interruption

if TYPE_CHECKING:
    from itlaudit.bisect.state import State

err = Console(stderr=True, soft_wrap=True)  # a piped log keeps each line whole
out = Console(soft_wrap=True)

VERDICT, OUTPUT = "Verdict", "Output"
# Settings' own defaults: the options show and use these, no copies.
_DEFAULTS = Settings(good="", bad="")


def Opt(panel: str, *decls: str, **kwargs: Any) -> Any:
    """typer.Option in one of bisect's help panels (forty options do not read as one list)."""
    return typer.Option(*decls, rich_help_panel=panel, **kwargs)


def _probe_trials(trials: str) -> int | None:
    """--trials N (at least N trials a probe), or auto (None: the judge's own, 3 for timing, else 1)."""
    if trials == "auto":
        return None
    if not trials.isdigit() or int(trials) < 1:
        raise BisectError(f"--trials {trials}: must be a whole number of at least 1, or auto")
    return int(trials)


def _new_state(settings: Settings, out_dir: Path | None) -> tuple[State, Path]:
    from itlaudit.bisect import state as state_mod
    from itlaudit.bisect.bisector import probe_scenario
    from itlaudit.bisect.settings import list_builds
    from itlaudit.store.rundir import DEFAULT_REPORTS, new_run_dir

    probe_scenario(settings)  # a bad scenario or variant fails before any folder is made
    builds = list_builds(settings)
    if out_dir is None:
        out_dir = new_run_dir(DEFAULT_REPORTS, f"bisect-{settings.good[:9]}-{settings.bad[:9]}")
    elif (out_dir / state_mod.STATE_FILE).exists():
        raise BisectError(f"{out_dir} already holds a bisection; continue it with --resume {out_dir}")
    out_dir.mkdir(parents=True, exist_ok=True)
    state = state_mod.State(settings=settings, builds=builds)
    state.save(out_dir)
    return state, out_dir


# What --resume may be given with: the folder, the range it was started with (checked), and the
# credentials, which are never stored and so must come again.
_RESUME_KEEPS = frozenset({"ctx", "resume", "good", "bad", "api_key", "header"})


def _refuse_other_options(ctx: typer.Context, resume: Path, settings: Settings) -> None:
    """--resume continues a bisection with the options it was started with (bisect.json keeps them);
    any other option given on the command line would be ignored, so it is refused in one line that
    names each and, where the folder keeps it under the option's name, the value it was started with."""
    given = [
        name
        for name in ctx.params
        if name not in _RESUME_KEEPS
        and (source := ctx.get_parameter_source(name)) is not None
        and source.name in ("COMMANDLINE", "ENVIRONMENT")
    ]
    if not given:
        return
    stored = settings.to_json()
    setup = stored["setup"]
    if isinstance(setup, dict):
        provider = setup["provider"]
        stored = {**stored, **setup, **(provider if isinstance(provider, dict) else {})}
    named = ", ".join(
        f"--{name.replace('_', '-')}" + (f" (started with {stored[name]!r})" if name in stored else "")
        for name in given
    )
    raise BisectError(
        f"--resume {resume} continues the bisection with the options it was started with "
        f"({resume / 'bisect.json'}), not {named}: drop them, or start a new bisection with a new --out"
    )


@with_options("capture", trial_capture_options)
@with_options("setup", probe_setup_options)
def bisect(
    ctx: typer.Context,
    good: Annotated[str | None, Opt(GENERAL, "--from", help="Good (older) commit or version.")] = None,
    bad: Annotated[str | None, Opt(GENERAL, "--to", help="Bad (newer) commit or version.")] = None,
    find_fix: Annotated[
        bool, Opt(VERDICT, "--find-fix", help="--from has the problem, --to not: find the fix.")
    ] = _DEFAULTS.find_fix,
    regress: Annotated[
        str,
        Opt(
            VERDICT,
            metavar="RULE",
            help=f"What bad means: one of {', '.join(JUDGES)}; finding:CODE names the finding, script comes "
            "with --script. auto: ITL, truncation or errors differ from the good end.",
        ),
    ] = _DEFAULTS.regress.text,
    script: Annotated[
        str | None, Opt(VERDICT, help="Judge with CMD RUN_DIR: exit 0 good, 125 skip, 1-127 bad.")
    ] = None,
    threshold: Annotated[
        float, Opt(VERDICT, metavar="R", help="ITL ratio vs the good end that counts as bad.")
    ] = _DEFAULTS.threshold,
    alpha: Annotated[
        float, Opt(VERDICT, help="Significance level of the Mann-Whitney U test.")
    ] = _DEFAULTS.alpha,
    trials: Annotated[str, Opt(VERDICT, metavar="N|auto", help=TRIALS_HELP)] = "auto",
    max_trials: Annotated[int, Opt(VERDICT, metavar="N", help=MAX_TRIALS_HELP)] = _DEFAULTS.max_trials,
    prefetch: Annotated[
        bool | None, Opt(PROVIDER, "--prefetch/--no-prefetch", help="Prepare next builds during a probe.")
    ] = _DEFAULTS.prefetch,
    dry_run: Annotated[
        bool,
        Opt(
            GENERAL,
            "--dry-run",
            help="Print the range, which builds the provider finds, probes and download; install nothing.",
        ),
    ] = False,
    out_dir: Annotated[
        Path | None, Opt(OUTPUT, "--out", help="Bisection folder (default reports/bisect-...).")
    ] = None,
    resume: Annotated[Path | None, Opt(OUTPUT, help="Continue the bisection in this folder.")] = None,
    parallel: Annotated[
        int, Opt(GENERAL, help="Builds probed per round, each on its own GPU (CUDA_VISIBLE_DEVICES 0..K-1).")
    ] = _DEFAULTS.parallel,
    cluster: Annotated[str, cluster_option(GENERAL)] = "none",
    *,
    setup: ProbeSetup,
    capture: CaptureOptions,
) -> None:
    """Find the vLLM build that introduced (or, with --find-fix, fixed) a serving regression."""
    # Imported here: scipy and pandas take seconds to import, and every other itlaudit command
    # (including each `itlaudit sim` a bisection starts) would pay for them.
    from itlaudit.bisect import state as state_mod
    from itlaudit.bisect.bisector import Bisection
    from itlaudit.bisect.dryrun import dry_run_report
    from itlaudit.bisect.report import REPORT_FILE, write_report
    from itlaudit.bisect.search import Search

    if resume is not None:
        state = state_mod.load(resume)
        bisect_dir = resume
        _refuse_other_options(ctx, resume, state.settings)
        for flag, given, stored in (("--from", good, state.settings.good), ("--to", bad, state.settings.bad)):
            if given is not None and not state_mod.same_build(given, stored):
                raise BisectError(
                    f"--resume {resume} bisects {state.settings.good}..{state.settings.bad}, not {flag} "
                    f"{given}; drop --from/--to to continue it, or start the other range with a new --out"
                )
        state.settings = state.settings.with_access(capture)
    else:
        if not good or not bad:
            raise BisectError("give --from GOOD --to BAD (or --resume DIR)")
        settings = Settings(
            good=good,
            bad=bad,
            setup=setup,
            regress=parse_regress(regress, script),
            find_fix=find_fix,
            threshold=threshold,
            alpha=alpha,
            trials=_probe_trials(trials),
            max_trials=max_trials,
            prefetch=prefetch,
            parallel=parallel,
            cluster=parse_cluster(cluster),
            capture=capture,
        )
        if dry_run:
            dry_run_report(settings, out)
            return
        state, bisect_dir = _new_state(settings, out_dir)
    if state.status == "done":
        out.print(state.result.message or "done")
        return
    count = len(state.builds)
    k = state.settings.parallel
    plan = (
        f"~{Search(count).remaining_estimate()} probes"
        if k == 1
        else (f"~{Search(count).remaining_estimate(k)} rounds of {k} probes at once")
    )
    err.print(
        f"bisecting {count} builds ({state.builds[0].label} … {state.builds[-1].label}); "
        f"{plan} after checking both ends; scenario "
        f"{state.settings.setup.scenario}, verdict --regress {state.settings.regress.text}; "
        f"folder {bisect_dir.resolve()}",
        highlight=False,
        soft_wrap=True,
    )
    try:
        state = Bisection.assemble(state, bisect_dir, err).run()
    except KeyboardInterrupt:
        signal_name, exit_code = interruption()  # SIGTERM too (workflows.run.handle_signals): 143
        write_report(state, bisect_dir, plot=True)
        command = f"itlaudit bisect --resume {shlex.quote(str(bisect_dir))}"
        raise RunInterrupted(
            signal_name,
            exit_code,
            f"interrupted by {signal_name}; finished probes are in {bisect_dir}; resume with: {command}",
        ) from None
    out.print(f"[bold]{state.result.message}[/bold]", highlight=False, soft_wrap=True)
    if state.result.explanation:
        out.print(state.result.explanation, highlight=False, markup=False, soft_wrap=True)
    out.print(f"compare: {state.result.compare_url}", highlight=False, soft_wrap=True)
    out.print(f"report: {(bisect_dir / REPORT_FILE).resolve()}", highlight=False, soft_wrap=True)
