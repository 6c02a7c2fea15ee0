"""The bisection loop: check both ends, then probe what the search asks for until it has an answer.

Order of work per probe, chosen so nothing is lost at any interruption: mark the probe in progress in
bisect.json, start preparing the builds the next step may need, run the probe, write its result to
bisect.json and report.md, and only then choose the next build.

With `--parallel K` a round probes K builds at once (the search's multisection points), each with its
own GPU: `CUDA_VISIBLE_DEVICES` 0..K-1 on this host, or a Ray task holding one GPU with `--cluster`.
The ends stay one probe a round each, the good end first: every other verdict is judged against it.

`Bisection` is handed its collaborators (mozregression's Application builds the Bisector's): the
prober that runs one probe (here, or on Ray), the prefetcher (and so the provider), the console and
the clock; `Bisection.assemble` builds them from the settings, and a test can hand in fakes.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Protocol

from rich.console import Console

from itlaudit.bisect import state as state_mod
from itlaudit.bisect.build_range import Build
from itlaudit.bisect.cluster import require_gpus, run_probe_on_ray
from itlaudit.bisect.figures import Figures, read_probe
from itlaudit.bisect.prefetch import Prefetcher
from itlaudit.bisect.probe import OnServer, ProbeConfig, ProbeResult, run_probe
from itlaudit.bisect.providers.command import CommandOptions
from itlaudit.bisect.report import compare_url, write_report
from itlaudit.bisect.search import Answer, Search
from itlaudit.bisect.settings import ProbeSetup, Settings, make_provider
from itlaudit.bisect.state import BisectResult, PendingProbe, ProbeRecord, State
from itlaudit.capture.cluster import connect
from itlaudit.errors import BisectError
from itlaudit.model.launch import LaunchKind, LaunchSpec
from itlaudit.model.scenario import Scenario, load_scenario
from itlaudit.model.stop import check
from itlaudit.model.vocabulary import Verdict
from itlaudit.report.progress import Reporter, duration
from itlaudit.serve.launch_config import launch_spec


def probe_scenario(settings: Settings) -> tuple[Scenario, dict[str, LaunchSpec]]:
    """The scenario reduced to the chosen variants (default: all of them, in its order), and the
    server settings (model, args, env) each asks for; the provider then decides which build serves them,
    so a variant's [variants.launch] table needs no `kind`: its server arguments are what count."""
    setup = settings.setup
    scenario = load_scenario(Path(setup.scenario), provided=True)
    names = [v.name for v in scenario.variants]
    wanted = setup.variants or names
    for name in wanted:
        if name not in names:
            raise BisectError(f"--only {name!r} is not in {setup.scenario} (variants: {', '.join(names)})")
    if settings.regress.across_variants and len(wanted) != 2:
        raise BisectError(
            f"--regress speedup compares two variants, the baseline first; {setup.scenario} has "
            f"{len(wanted)}: pick two with --only K0 --only K3"
        )
    variants = [next(v for v in scenario.variants if v.name == name) for name in wanted]
    specs: dict[str, LaunchSpec] = {}
    for variant in variants:
        spec = launch_spec(variant.launch) if variant.launch is not None else LaunchSpec(kind=LaunchKind.URL)
        spec = dataclasses.replace(
            spec,
            model=setup.model or spec.model,
            server_args=[*spec.server_args, *setup.server_args],
            ready_timeout_s=setup.ready_timeout_s or spec.ready_timeout_s,
        )
        if spec.model is None and not isinstance(setup.provider, CommandOptions):
            raise BisectError(
                f"variant {variant.name!r} of {setup.scenario} names no model to serve; pass --model "
                "(e.g. --model nvidia/Qwen3.6-35B-A3B-NVFP4)"
            )
        specs[variant.name] = spec
    return dataclasses.replace(scenario, variants=variants), specs


def _first_line(text: str) -> str:
    """Launch failures carry the server's log tail; the console gets its headline, bisect.json all."""
    return text.strip().splitlines()[0] if text.strip() else ""


def probe_config(settings: Settings, *, max_trials: int | None = None) -> ProbeConfig:
    """What every probe of these settings runs: the scenario's chosen variants, the verdict rule, the
    trials and the capture options. `max_trials`: a nightly probes each build once, so it caps the
    repeats a bisect step may add."""
    scenario, specs = probe_scenario(settings)
    return ProbeConfig(
        scenario=scenario,
        specs=specs,
        regress=settings.regress,
        threshold=settings.threshold,
        alpha=settings.alpha,
        trials=settings.effective_trials,
        max_trials=settings.max_trials if max_trials is None else max_trials,
        capture=settings.capture,
    )


ProbeOutcome = tuple[ProbeResult, str | None, list[str]]  # the result, the GPU it had, Ray nodes lost


class Prober(Protocol):
    """Runs one probe of `build` into `probe_dir` (judged against `baseline`, the good end's figures);
    `gpu` is a parallel round's slot. `remote`: the probe runs elsewhere (Ray), which picks its GPU."""

    remote: bool

    def __call__(
        self,
        build: Build,
        probe_dir: Path,
        baseline: dict[str, Figures] | None,
        on_server: OnServer,
        on_node: Callable[[str], None],
        gpu: int | None,
    ) -> ProbeOutcome: ...


@dataclass
class LocalProber:
    """Probes on this host: a parallel round's slot gets its GPU through CUDA_VISIBLE_DEVICES, a
    lone probe none."""

    config: ProbeConfig
    prefetcher: Prefetcher
    remote: bool = False

    def __call__(
        self,
        build: Build,
        probe_dir: Path,
        baseline: dict[str, Figures] | None,
        on_server: OnServer,
        on_node: Callable[[str], None],
        gpu: int | None,
    ) -> ProbeOutcome:
        config = self.config
        if gpu is not None:
            device = {"CUDA_VISIBLE_DEVICES": str(gpu)}
            config = dataclasses.replace(
                config,
                specs={n: dataclasses.replace(s, env={**s.env, **device}) for n, s in config.specs.items()},
            )
        result = run_probe(config, self.prefetcher, build, probe_dir, baseline, on_server)
        return result, None if gpu is None else str(gpu), []


@dataclass
class RayProber:
    """Each probe a Ray task holding one GPU, its build prepared on its node (bisect/cluster.py)."""

    cluster: ModuleType
    setup: ProbeSetup
    config: ProbeConfig
    remote: bool = True

    def __call__(
        self,
        build: Build,
        probe_dir: Path,
        baseline: dict[str, Figures] | None,
        on_server: OnServer,
        on_node: Callable[[str], None],
        gpu: int | None,
    ) -> ProbeOutcome:
        return run_probe_on_ray(self.cluster, self.setup, self.config, build, probe_dir, baseline, on_node)


class Bisection:
    def __init__(
        self,
        state: State,
        bisect_dir: Path,
        *,
        prober: Prober,
        prefetcher: Prefetcher,
        console: Console,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`prefetcher` prepares the builds the search may want next (its provider is the one the
        prober's probes get their builds from); `clock` times the bisection (elapsed_s)."""
        self.state = state
        self.dir = bisect_dir
        self.prober = prober
        self.prefetcher = prefetcher
        self.console = console
        self.clock = clock
        self.search = Search(len(state.builds))
        self.started = clock()
        self._lock = threading.Lock()  # a parallel round's probes share the state and its file

    @classmethod
    def assemble(cls, state: State, bisect_dir: Path, console: Console) -> Bisection:
        """The collaborators the settings call for: the probe config, the provider and its
        prefetcher, and the prober (here, or Ray tasks with --cluster, after checking it has GPUs)."""
        settings = state.settings
        config = probe_config(settings)
        provider, _ = make_provider(settings.setup, bisect_dir)
        # Under --cluster the nodes prepare the builds they probe; preparing them here too is waste.
        prefetcher = Prefetcher(provider, background=settings.effective_prefetch and not settings.cluster)
        prober: Prober = LocalProber(config, prefetcher)
        if settings.cluster is not None:
            cluster = connect(settings.cluster)
            require_gpus(cluster)
            prober = RayProber(cluster, settings.setup, config)
        return cls(state, bisect_dir, prober=prober, prefetcher=prefetcher, console=console)

    # -- roles ---------------------------------------------------------------------------------
    def _answer(self, verdict: str) -> Answer:
        return state_mod.answer(verdict, self.state.settings.find_fix)

    @property
    def _reference(self) -> int:
        """The good end: the ITL baseline, probed first."""
        return len(self.state.builds) - 1 if self.state.settings.find_fix else 0

    # -- state ---------------------------------------------------------------------------------
    def _save(self) -> None:
        self.state.save(self.dir)
        write_report(self.state, self.dir, plot=False)

    def _probe_of(self, index: int) -> ProbeRecord | None:
        return next((p for p in self.state.probes if p["index"] == index), None)

    def _baseline(self) -> dict[str, Figures] | None:
        """The good end's figures per variant, read back from its folder (so resume sees the same)."""
        record = self._probe_of(self._reference)
        return None if record is None else read_probe(Path(record["dir"]))

    def _recover(self) -> None:
        """Rerun the probes a dead run left half done; stop the servers they may have left."""
        for pending in self.state.in_progress:
            if state_mod.stop_orphan(pending):
                self.console.print(
                    f"stopped server left by the interrupted run (pgid {pending['server_pgid']})"
                )
            kept = state_mod.set_aside(Path(pending["dir"]))
            if kept is not None:
                self.console.print(f"probe cut short; its files are kept in {kept}; rerunning it")
        if self.state.in_progress:
            self.state.in_progress = []
            self._save()

    # -- probing -------------------------------------------------------------------------------
    def _probe(self, index: int, round_number: int, gpu: int | None = None) -> ProbeRecord:
        """One probe, marked in progress first; `gpu` (a parallel round's slot) is the GPU it gets."""
        build = self.state.builds[index]
        with self._lock:
            number = len(self.state.probes) + len(self.state.in_progress) + 1
            probe_dir = self.dir / f"probe-{number:02d}-{build.label}"
            pending: PendingProbe = {"index": index, "ref": build.ref, "dir": str(probe_dir)}
            self.state.in_progress.append(pending)
            self._save()
        where = f" on GPU {gpu}" if gpu is not None and not self.prober.remote else ""
        self.console.print(
            f"[bold]probe {number}[/bold] (round {round_number}): {build.label} "
            f"({index + 1}/{len(self.state.builds)}){where} …"
        )

        def on_server(pgid: int | None) -> None:
            if pgid is not None:
                with self._lock:
                    pending.update({"server_pgid": pgid, "server_argv": state_mod.cmdline(pgid)})
                    self._save()

        def on_node(node: str) -> None:
            """A Ray probe started on `node`; a second start means the first node died under it."""
            with self._lock:
                if "node" in pending:
                    self.console.print(
                        f"  probe {number} ({build.label}): its Ray node {pending['node']} was lost; "
                        f"running it again on node {node}",
                        highlight=False,
                        soft_wrap=True,
                    )
                pending["node"] = node
                self._save()

        baseline = None if index == self._reference else self._baseline()
        result, device, lost = self.prober(build, probe_dir, baseline, on_server, on_node, gpu)
        record: ProbeRecord = {
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
            "round": round_number,
            "gpu": device,
            "finished_at_unix": time.time(),
        }
        if self.prober.remote:
            record.update({"node": pending.get("node"), "lost_nodes": lost})
        with self._lock:
            self.state.probes.append(record)
            self.state.in_progress.remove(pending)
            self._save()
        return record

    def _probe_round(self, indices: list[int]) -> list[ProbeRecord]:
        """The round's probes at once, one thread each (daemon: an interrupt ends the run, and the
        servers die with it; resume reruns what was in flight). A lone probe runs here as before."""
        round_number = self.state.rounds + 1
        if self.state.settings.parallel == 1 and not self.prober.remote:
            return [self._probe(indices[0], round_number)]
        records: list[ProbeRecord] = []
        failures: list[BaseException] = []

        def one(index: int, slot: int) -> None:
            try:
                records.append(self._probe(index, round_number, slot))
            except BaseException as exc:  # raised below, in the bisection's own thread
                failures.append(exc)

        threads = [
            threading.Thread(target=one, args=(index, slot), name=f"probe-{index}", daemon=True)
            for slot, index in enumerate(indices)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():
                thread.join(0.05)  # in slices: a signal (model.stop) is seen here within 50 ms
                check()
        if failures:
            raise failures[0]
        return sorted(records, key=lambda r: r["index"])

    def _check_end(self, index: int, expected: str, role: str, given: str) -> None:
        record = self._probe_of(index) or self._probe_round([index])[0]
        verdict = record["verdict"]
        self._print_probe(record)
        if verdict == expected:
            return
        if verdict == Verdict.SKIP and record.get("lost_nodes"):
            problem = "could not be probed"
        elif verdict == Verdict.SKIP:
            problem = "could not be built or installed"
        elif verdict in (Verdict.GOOD, Verdict.BAD):
            problem = f"is {verdict}, not {expected}"
        else:
            problem = f"is not clearly {expected}"
        message = f"{role} ({given}) {problem}: {_first_line(record['reason'])}"
        self.state.status = "failed"
        self.state.result = BisectResult(message=message)
        self._save()
        raise BisectError(f"{message}. Check the range and --regress; probe files in {record['dir']}")

    def _to_go(self) -> str:
        k = self.state.settings.parallel
        if k == 1:
            return f"{self.search.remaining_estimate()} probe(s) to go"
        return f"{self.search.remaining_estimate(k)} round(s) of {k} to go"

    def _print_probe(self, record: ProbeRecord) -> None:
        colours: dict[str, str] = {Verdict.GOOD: "green", Verdict.BAD: "red"}
        colour = colours.get(record["verdict"], "yellow")
        lo, hi = self.search.bounds
        left = hi - lo - 1
        reason = _first_line(record["reason"])
        self.console.print(
            f"  {record['label']}: [{colour}]{record['verdict']}[/{colour}] ({reason}) · "
            f"{left} build(s) left between {self.state.builds[lo].label} and {self.state.builds[hi].label}"
            f" · ~{self._to_go()}",
            markup=True,
            highlight=False,
        )

    def run(self) -> State:
        started = self.clock()

        def status() -> str:
            """What the bisection is doing, for the heartbeat between probe lines (a probe installs,
            starts a server and runs its trials: minutes without a line of its own)."""
            with self._lock:
                done, running = len(self.state.probes), [p["ref"][:12] for p in self.state.in_progress]
            doing = f"probing {', '.join(running)}" if running else "between probes"
            return f"bisect: {done} probes done, {doing} ({duration(self.clock() - started)})"

        try:
            with Reporter(self.console).watch(status):
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
        ends = [(good_index, Verdict.GOOD, "GOOD", settings.bad if settings.find_fix else settings.good)]
        ends.append((bad_index, Verdict.BAD, "BAD", settings.good if settings.find_fix else settings.bad))
        self.prefetcher.want([self.state.builds[i] for i, *_ in ends])
        for index, expected, role, given in ends:
            self._check_end(index, expected, role, given)
        while indices := self.search.next_round(settings.parallel):
            upcoming = self.search.next_after(indices[0]) if len(indices) == 1 else indices
            self.prefetcher.want([self.state.builds[i] for i in upcoming])
            records = self._probe_round(indices)
            for record in records:
                self.search.record(record["index"], self._answer(record["verdict"]))
            for record in records:
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
        url = compare_url(builds[lo], builds[hi], settings.setup.github_repo)
        if len(candidates) == 1:
            message = f"{what}: {builds[hi].label}; {before}: {builds[lo].label}"
        else:
            message = (
                f"{what} is one of {len(candidates)} ({', '.join(b.label for b in candidates)}): builds "
                f"in between were skipped or unclear; {before}: {builds[lo].label}"
            )
        # The build that shows the problem next to the answer: what flipped there, in figures.
        showing = self._probe_of(lo if settings.find_fix else hi)
        detail = {} if showing is None else showing.get("detail", {})
        signals, explanation = detail.get("signals"), detail.get("explanation")
        self.state.status = "done"
        self.state.result = BisectResult(
            first_bad=builds[hi].ref if len(candidates) == 1 else None,
            last_good=builds[lo].ref,
            candidates=[b.ref for b in candidates],
            message=message,
            compare_url=url,
            signals=[str(s) for s in signals] if isinstance(signals, list) else [],
            explanation=f"{showing['label']}: {explanation}" if showing and explanation else None,
            probes_used=len(self.state.probes),
            rounds_used=self.state.rounds,
            elapsed_s=round(self.clock() - self.started, 1),
        )
        self.state.save(self.dir)
        write_report(self.state, self.dir, plot=True)
