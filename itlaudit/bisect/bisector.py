"""The bisection loop: check both ends, then probe what the search asks for until it has an answer.

Order of work per probe, chosen so nothing is lost at any interruption: mark the probe in progress in
bisect.json, start preparing the builds the next step may need, run the probe, write its result to
bisect.json and report.md, and only then choose the next build.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from itlaudit.bisect import state as state_mod
from itlaudit.bisect.figures import Figures, read_probe
from itlaudit.bisect.prefetch import Prefetcher
from itlaudit.bisect.probe import ProbeConfig, ProbeResult, run_probe
from itlaudit.bisect.report import compare_url, write_report
from itlaudit.bisect.search import Answer, Search
from itlaudit.bisect.settings import Settings, make_provider
from itlaudit.bisect.state import State
from itlaudit.bisect.verdict import BAD, GOOD, SKIP
from itlaudit.errors import BisectError
from itlaudit.model.scenario import Scenario, load_scenario
from itlaudit.serve.launch_config import launch_spec
from itlaudit.serve.launcher import LaunchSpec


def probe_scenario(settings: Settings) -> tuple[Scenario, dict[str, LaunchSpec]]:
    """The scenario reduced to the chosen variants (default: all of them, in its order), and the
    server settings (model, args, env) each asks for; the provider then decides which build serves them."""
    scenario = load_scenario(Path(settings.scenario))
    names = [v.name for v in scenario.variants]
    wanted = settings.variants or names
    for name in wanted:
        if name not in names:
            raise BisectError(
                f"--variant {name!r} is not in {settings.scenario} (variants: {', '.join(names)})"
            )
    if settings.regress_rule.across_variants and len(wanted) != 2:
        raise BisectError(
            f"--regress speedup compares two variants, the baseline first; {settings.scenario} has "
            f"{len(wanted)}: pick two with --variant K0 --variant K3"
        )
    variants = [next(v for v in scenario.variants if v.name == name) for name in wanted]
    specs: dict[str, LaunchSpec] = {}
    for variant in variants:
        spec = launch_spec(variant.launch) if variant.launch is not None else LaunchSpec(kind="url")
        spec = dataclasses.replace(
            spec,
            model=settings.model or spec.model,
            server_args=[*spec.server_args, *settings.server_args],
            ready_timeout_s=settings.ready_timeout_s or spec.ready_timeout_s,
        )
        if spec.model is None and settings.provider != "command":
            raise BisectError(
                f"variant {variant.name!r} of {settings.scenario} names no model to serve; pass --model "
                "(e.g. --model nvidia/Qwen3.6-35B-A3B-NVFP4)"
            )
        specs[variant.name] = spec
    return dataclasses.replace(scenario, variants=variants), specs


def _first_line(text: str) -> str:
    """Launch failures carry the server's log tail; the console gets its headline, bisect.json all."""
    return text.strip().splitlines()[0] if text.strip() else ""


class Bisection:
    def __init__(self, state: State, bisect_dir: Path, console: Console) -> None:
        self.state = state
        self.dir = bisect_dir
        self.console = console
        settings = state.settings
        scenario, specs = probe_scenario(settings)
        self.config = ProbeConfig(
            scenario=scenario,
            specs=specs,
            regress=settings.regress_rule,
            threshold=settings.threshold,
            alpha=settings.alpha,
            trials=settings.effective_trials,
            max_trials=settings.max_trials,
        )
        provider, self.cache = make_provider(settings, bisect_dir)
        self.prefetcher = Prefetcher(provider, background=settings.effective_prefetch)
        self.search = Search(len(state.builds))
        self.started = time.monotonic()

    # -- roles ---------------------------------------------------------------------------------
    @property
    def _yes(self) -> str:
        """The verdict that moves the search's upper bound: bad normally, good when hunting the fix."""
        return GOOD if self.state.settings.find_fix else BAD

    def _answer(self, verdict: str) -> Answer:
        if verdict not in (GOOD, BAD):
            return Answer.UNKNOWN
        return Answer.YES if verdict == self._yes else Answer.NO

    @property
    def _reference(self) -> int:
        """The good end: the ITL baseline, probed first."""
        return len(self.state.builds) - 1 if self.state.settings.find_fix else 0

    # -- state ---------------------------------------------------------------------------------
    def _save(self) -> None:
        self.state.save(self.dir)
        write_report(self.state, self.dir, plot=False)

    def _probe_of(self, index: int) -> dict[str, Any] | None:
        return next((p for p in self.state.probes if p["index"] == index), None)

    def _baseline(self) -> dict[str, Figures] | None:
        """The good end's figures per variant, read back from its folder (so resume sees the same)."""
        record = self._probe_of(self._reference)
        return None if record is None else read_probe(Path(record["dir"]))

    def _recover(self) -> None:
        """Rerun a probe that a dead run left half done; stop the server it may have left."""
        pending = self.state.in_progress
        if pending is None:
            return
        if state_mod.stop_orphan(pending):
            self.console.print(f"stopped server left by the interrupted run (pgid {pending['server_pgid']})")
        kept = state_mod.set_aside(Path(pending["dir"]))
        if kept is not None:
            self.console.print(f"probe cut short; its files are kept in {kept}; rerunning it")
        self.state.in_progress = None
        self._save()

    # -- probing -------------------------------------------------------------------------------
    def _probe(self, index: int) -> dict[str, Any]:
        build = self.state.builds[index]
        number = len(self.state.probes) + 1
        probe_dir = self.dir / f"probe-{number:02d}-{build.label}"
        self.state.in_progress = {"index": index, "ref": build.ref, "dir": str(probe_dir)}
        self._save()
        self.console.print(
            f"[bold]probe {number}[/bold]: {build.label} ({index + 1}/{len(self.state.builds)}) …"
        )

        def on_server(pgid: int | None) -> None:
            assert self.state.in_progress is not None
            if pgid is not None:
                self.state.in_progress.update(server_pgid=pgid, server_argv=state_mod.cmdline(pgid))
                self._save()

        baseline = None if index == self._reference else self._baseline()
        result: ProbeResult = run_probe(self.config, self.prefetcher, build, probe_dir, baseline, on_server)
        record = {
            "index": index,
            "build": build.ref,
            "commit": build.ref if build.kind == "commit" else None,
            "label": build.label,
            "version": result.version,
            "verdict": result.verdict,
            "reason": result.reason,
            "trials": result.trials,
            "metrics": result.metrics,
            "detail": result.detail,
            "dir": str(probe_dir),
            "finished_at_unix": time.time(),
        }
        self.state.probes.append(record)
        self.state.in_progress = None
        self._save()
        return record

    def _check_end(self, index: int, expected: str, role: str, given: str) -> None:
        record = self._probe_of(index) or self._probe(index)
        verdict = record["verdict"]
        self._print_probe(record)
        if verdict == expected:
            return
        if verdict == SKIP:
            problem = "could not be built or installed"
        elif verdict in (GOOD, BAD):
            problem = f"is {verdict}, not {expected}"
        else:
            problem = f"is not clearly {expected}"
        message = f"{role} ({given}) {problem}: {_first_line(record['reason'])}"
        self.state.status = "failed"
        self.state.result = {"message": message}
        self._save()
        raise BisectError(f"{message}. Check the range and --regress; probe files in {record['dir']}")

    def _print_probe(self, record: dict[str, Any]) -> None:
        colour = {GOOD: "green", BAD: "red"}.get(record["verdict"], "yellow")
        lo, hi = self.search.bounds
        left = hi - lo - 1
        reason = _first_line(record["reason"])
        self.console.print(
            f"  {record['label']}: [{colour}]{record['verdict']}[/{colour}] ({reason}) · "
            f"{left} build(s) left between {self.state.builds[lo].label} and {self.state.builds[hi].label}"
            f" · ~{self.search.remaining_estimate()} probe(s) to go",
            markup=True,
            highlight=False,
        )

    def run(self) -> State:
        try:
            return self._run()
        finally:
            self.prefetcher.close()

    def _run(self) -> State:
        settings = self.state.settings
        self._recover()
        last = len(self.state.builds) - 1
        for record in self.state.probes:
            if record["index"] not in (0, last):
                self.search.record(record["index"], self._answer(record["verdict"]))
        good_index, bad_index = (last, 0) if settings.find_fix else (0, last)
        ends = [(good_index, GOOD, "GOOD", settings.bad if settings.find_fix else settings.good)]
        ends.append((bad_index, BAD, "BAD", settings.good if settings.find_fix else settings.bad))
        self.prefetcher.want([self.state.builds[i] for i, *_ in ends])
        for index, expected, role, given in ends:
            self._check_end(index, expected, role, given)
        while (index := self.search.next_index()) is not None:
            self.prefetcher.want([self.state.builds[i] for i in self.search.next_after(index)])
            record = self._probe(index)
            self.search.record(index, self._answer(record["verdict"]))
            self._print_probe(record)
        self._finish()
        return self.state

    def _finish(self) -> None:
        settings = self.state.settings
        lo, hi = self.search.bounds
        builds = self.state.builds
        what = "first fixed build" if settings.find_fix else "first bad build"
        before = "last unfixed build" if settings.find_fix else "last good build"
        candidates = [builds[i] for i in self.search.candidates]
        url = compare_url(builds[lo], builds[hi], settings.github_repo)
        if len(candidates) == 1:
            message = f"{what}: {builds[hi].label}; {before}: {builds[lo].label}"
        else:
            message = (
                f"{what} is one of {len(candidates)} ({', '.join(b.label for b in candidates)}): builds "
                f"in between were skipped or unclear; {before}: {builds[lo].label}"
            )
        # The build that shows the problem next to the answer: what flipped there, in figures.
        showing = self._probe_of(lo if settings.find_fix else hi) or {}
        detail = showing.get("detail", {})
        self.state.status = "done"
        self.state.result = {
            "first_bad": builds[hi].ref if len(candidates) == 1 else None,
            "last_good": builds[lo].ref,
            "candidates": [b.ref for b in candidates],
            "message": message,
            "compare_url": url,
            "signals": detail.get("signals", []),
            "explanation": f"{showing['label']}: {detail['explanation']}"
            if detail.get("explanation")
            else None,
            "probes_used": len(self.state.probes),
            "elapsed_s": round(time.monotonic() - self.started, 1),
        }
        self.state.save(self.dir)
        write_report(self.state, self.dir, plot=True)
