"""Composes a run: for each variant, find or start its server, stream the workload, land records,
then derive the run's files. Shared by `run` and `compare`; it holds no figures of its own."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import sys
import time
from collections.abc import Coroutine, Iterator, Sequence
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from rich.console import Console

from itlaudit.analysis.summary import RunSummary
from itlaudit.capture.described import CaptureDescription
from itlaudit.capture.runner import CaptureOptions, variant_access
from itlaudit.errors import ItlauditError, RunDirError, RunInterrupted, ScenarioError
from itlaudit.model.access import NO_ACCESS, Access, url_credentials_problem
from itlaudit.model.jsonvalue import JSONObject
from itlaudit.model.records import RequestRecord
from itlaudit.model.run_labels import RunLabels
from itlaudit.model.scenario import Scenario, Variant
from itlaudit.model.stop import check, interruption, on_second, requested
from itlaudit.report.progress import Reporter, duration
from itlaudit.serve.environment import gpus as host_gpus
from itlaudit.store.jsonl import iter_jsonl
from itlaudit.store.lock import hold_run_lock, refuse_if_live
from itlaudit.store.rundir import REPORT_FILE, REQUESTS_FILE, SUMMARY_FILE, new_run_dir, remove_partial
from itlaudit.workflows.run_folder import server_log_name

if TYPE_CHECKING:
    from itlaudit.capture.server_info import ServerIdentity
    from itlaudit.model.meta import Meta
    from itlaudit.workflows.derive import Derivation
    from itlaudit.workflows.run_folder import RunFolder
    from itlaudit.workflows.variant_pass import PassResult, WindowHook

__all__ = [
    "DEFAULT_REPORTS",
    "RUN_DIR_ENV",
    "LedgerPolicy",
    "RunOutcome",
    "held_signals",
    "mark_interrupted",
    "run_scenario",
    "run_until_stopped",
    "variant_target",
]

DEFAULT_REPORTS = Path("reports")
RUN_DIR_ENV = "ITLAUDIT_RUN_DIR"


@dataclass(frozen=True)
class LedgerPolicy:
    """The experiment ledger as `run`/`compare` use it: a repeat is named (with the diff that compares
    it), and refused only with `no_repeat`."""

    path: Path
    no_repeat: bool = False

    def check(
        self,
        scenario: Scenario,
        variant: str,
        base_url: str,
        identity: ServerIdentity,
        run_dir: Path,
        console: Console | None,
    ) -> JSONObject:
        """Fingerprint the variant's server from its identity (read by the variant's pass before its
        /metrics window opens: the identity ping is a request of itlaudit's own and must not count in
        the server's figures); a repeat is named, or refused with no_repeat."""
        from itlaudit.store import ledger

        if identity.get("unknown") and console is not None:
            console.print(
                f"{variant}: server build unknown ({identity['unknown']})", markup=False, soft_wrap=True
            )
        launched = next(v for v in scenario.variants if v.name == variant).launch is not None
        fingerprint = ledger.variant_fingerprint(
            scenario, variant, identity, os.environ, url=base_url, gpus=host_gpus() if launched else None
        )
        earlier = ledger.check_new_run(fingerprint, self.path, no_repeat=self.no_repeat)
        if earlier is not None and console is not None:
            console.print(
                ledger.repeat_warning(earlier, variant, run_dir),
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
        return fingerprint.to_json()

    def record(self, run_dir: Path, summary: RunSummary, records: list[RequestRecord]) -> None:
        """The finished run's lines, from the summary and records its one derivation gave."""
        from itlaudit.store import ledger

        ledger.record_run(run_dir, self.path, environ=os.environ, summary=summary, records=records)


@dataclass
class RunOutcome:
    """A finished run: its folder, the one derivation of its figures and each variant's pass (this
    round's), typed: its callers (compare, smoke, trials) read these, never the files just written."""

    run_dir: Path
    derivation: Derivation
    meta: Meta  # meta.json as the run wrote it
    passes: dict[str, PassResult] = field(default_factory=dict)

    @property
    def records(self) -> list[RequestRecord]:
        """What the figures counted: no warmup, every --append round."""
        return self.derivation.records

    @property
    def finding_count(self) -> int:
        return sum(sum(block.findings.values()) for block in self.derivation.summary.variants.values())


@contextmanager
def variant_target(
    variant: Variant, override_url: str | None, run_dir: Path, access: Access = NO_ACCESS
) -> Iterator[str]:
    """Yield the base URL for a variant, starting (and always stopping) its server when it has one."""
    if override_url:
        yield override_url
        return
    if variant.launch is not None:
        from itlaudit.serve.launch_config import launch_spec
        from itlaudit.serve.launcher import launch

        spec = launch_spec(variant.launch)
        # Tags the server's processes with the run that owns them, so a leftover is traceable.
        spec.env[RUN_DIR_ENV] = str(run_dir.resolve())
        with launch(spec, run_dir / server_log_name(variant.name), access) as server:
            yield server.url
        return
    if variant.url:
        yield variant.url
        return
    raise ScenarioError(
        f"variant {variant.name!r} has no `url` and no [variants.launch]; add one, or pass --url / "
        f"--variant {variant.name}=URL"
    )


def _open_run_dir(run_dir: Path | None, scenario_name: str, append: bool) -> Path:
    """The run folder, created now. An existing run is refused unless appending: two runs in one
    requests.jsonl would mix their figures silently. Unwritable locations end in one line."""
    try:
        if run_dir is None:
            return new_run_dir(DEFAULT_REPORTS, scenario_name)
        # A folder another run is writing is refused first, whether or not it has records yet.
        refuse_if_live(run_dir, f"--out {run_dir}")
        # Records make a run; a folder left by a refused or failed start (meta.json only) is reusable.
        requests = run_dir / REQUESTS_FILE
        if requests.is_file() and requests.stat().st_size > 0 and not append:
            raise RunDirError(
                f"--out {run_dir} already holds a run; pass --append to add to it, or choose a new folder"
            )
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".itlaudit-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        where = run_dir if run_dir is not None else DEFAULT_REPORTS
        raise RunDirError(
            f"cannot write the run folder {where}: {exc.strerror or exc}; choose another --out"
        ) from None
    return run_dir


def _append_tag(requests: Path) -> str | None:
    """For --append: cut a half-written last line (a crash mid-write; its request never finished) so
    the next line starts clean, and pick a tag (`r2`, `r3`, ...) that keeps request ids unique."""
    if not requests.exists():
        return None
    data = requests.read_bytes()
    if data and not data.endswith(b"\n"):
        with requests.open("r+b") as fh:
            fh.truncate(data.rfind(b"\n") + 1)
    ids = {str(line.get("request_id")) for line in iter_jsonl(requests)}
    round_number = 2
    while any(f".r{round_number}-" in request_id for request_id in ids):
        round_number += 1
    return f"r{round_number}"


def run_scenario(
    scenario: Scenario,
    *,
    url: str | None = None,
    variant_urls: dict[str, str] | None = None,
    run_dir: Path | None = None,
    console: Console | None = None,
    hooks: Sequence[WindowHook] = (),
    ledger: LedgerPolicy | None = None,
    append: bool = False,
    capture: CaptureOptions | None = None,
    labels: RunLabels | None = None,
    report: bool = True,
) -> RunOutcome:
    """Run every variant in turn, each through its VariantPass (workflows/variant_pass.py), into one
    RunFolder. With a ledger, each variant is fingerprinted before it is measured (a repeat is named,
    or refused with no_repeat) and the finished run is recorded.

    A variant's measured window (the `hooks`) holds its measured requests and nothing else: warmup
    requests finish before it opens, the identity ping comes before it and the /version read of the
    environment record after it. With report=False the folder's figures are derived but the report
    is left to the caller (compare adds compare.json first).

    The run holds its folder's lock (store.lock) from the start until its summary is written, so
    `report` and a second run can tell it is still going. However it ends (finished, SIGINT/SIGTERM,
    a capture worker lost, any error after requests were sent), summary.json and the report are
    rewritten from every record in requests.jsonl, and `report --live`'s partial/ folder is removed;
    an interrupt then raises RunInterrupted, an error is re-raised."""
    variant_urls = variant_urls or {}
    unknown = set(variant_urls) - {v.name for v in scenario.variants}
    if unknown:
        names = ", ".join(v.name for v in scenario.variants)
        raise ScenarioError(f"--variant names {', '.join(sorted(unknown))}, not in the scenario ({names})")
    for variant in scenario.variants:
        target = url or variant_urls.get(variant.name) or variant.url
        problem = target and url_credentials_problem(target, variant_access(scenario, variant.name, capture))
        if problem:
            raise ScenarioError(f"variant {variant.name}: {problem}")
    if capture is None or capture.cluster is None:  # local capture workers: their forkserver boots meanwhile
        from itlaudit.capture.workers import prestart_workers

        prestart_workers()
    check()  # a signal while the dataset was drawn (seconds for the largest): no folder is made
    folder = _open_run_dir(run_dir, scenario.folder_name, append)
    try:
        with hold_run_lock(folder, f"--out {folder}"):
            return _run_in_folder(
                scenario,
                folder,
                url=url,
                variant_urls=variant_urls,
                console=console,
                hooks=hooks,
                ledger=ledger,
                append=append,
                capture=capture,
                labels=labels,
                report=report,
            )
    finally:
        remove_partial(folder)  # after the lock is let go: a `report --live` then sees the run over


def _run_in_folder(
    scenario: Scenario,
    run_dir: Path,
    *,
    url: str | None,
    variant_urls: dict[str, str],
    console: Console | None,
    hooks: Sequence[WindowHook],
    ledger: LedgerPolicy | None,
    append: bool,
    capture: CaptureOptions | None,
    labels: RunLabels | None,
    report: bool,
) -> RunOutcome:
    """run_scenario's work, in a folder it holds."""
    # The capture and report stacks load here, not at the top: the CLI imports this module to start.
    from itlaudit.capture.cluster import lost_worker_warnings
    from itlaudit.workflows.run_folder import RunFolder
    from itlaudit.workflows.variant_pass import VariantPass

    tag = _append_tag(run_dir / REQUESTS_FILE) if append else None
    context: JSONObject | None = (
        {"appended_at_unix": time.time(), "append_tag": tag} if tag is not None else None
    )
    folder = RunFolder.begin(run_dir, scenario, labels=labels, context=context, extend=tag is not None)
    workload = scenario.workload
    per_variant = workload.num_requests + workload.arrivals.warmup_requests  # every record counts
    total = per_variant * len(scenario.variants)
    reporter = Reporter(console)
    writer = folder.records()
    passes: dict[str, PassResult] = {}
    try:
        with reporter.capture("requests", total) as counts, writer:
            writer.counts = counts
            for variant in scenario.variants:
                override = url or variant_urls.get(variant.name)
                launched = variant.launch if not override else None
                access = variant_access(scenario, variant.name, capture)
                check()  # a signal between two variants: the next one never starts
                with ExitStack() as server:
                    starting = reporter.step(f"{variant.name}: starting its server") if launched else None
                    with starting or nullcontext():
                        base_url = server.enter_context(variant_target(variant, override, run_dir, access))
                    counts.begin(f"{variant.name} @ {base_url}", per_variant)
                    variant_started = time.monotonic()

                    def on_capture(
                        workers: CaptureDescription, name: str = variant.name, url: str = base_url
                    ) -> None:
                        """The phase line comes here, once the server has answered the model lookup."""
                        if "workers" in workers:
                            counts.sending()
                            count = len(workers["workers"])
                            reporter.phase(
                                f"{name}: {workload.num_requests} requests to {url} over "
                                f"{count} capture process{'es' if count > 1 else ''}"
                            )
                        dataset = scenario.workload.dataset
                        if workers.get("reply_lengths") == "estimated" and dataset and console:
                            console.print(f"warning: {dataset.warning}", markup=False, soft_wrap=True)
                        if "random_chat" in workers and console:
                            note = workers["random_chat"]["note"]
                            console.print(f"{name}: {note}", markup=False, soft_wrap=True)
                        for warning in lost_worker_warnings(workers):
                            (console or Console(stderr=True)).print(warning, markup=False, soft_wrap=True)

                    passed = passes[variant.name] = run_until_stopped(
                        VariantPass(
                            scenario,
                            variant,
                            base_url,
                            folder,
                            writer,
                            capture=capture,
                            ledger=ledger,
                            console=console,
                            hooks=hooks,
                            launched=launched,
                            id_tag=tag,
                            on_done=counts.landed,
                            on_prepare=counts.prepare,
                            on_capture=on_capture,
                        ).run()
                    )
                    reporter.phase(
                        f"{variant.name}: {len(passed.capture.records)} requests done in "
                        f"{duration(time.monotonic() - variant_started)}"
                    )
                    if launched is not None:
                        reporter.phase(f"{variant.name}: stopping its server")
                folder.save()
    except KeyboardInterrupt:
        raise _wrap_up_interrupted(folder, scenario, reporter) from None
    except Exception as exc:
        _wrap_up_failed(folder, scenario, reporter, exc)
        raise
    order = [v.name for v in scenario.variants]
    hint = f"`itlaudit report {run_dir}` derives its figures"
    with held_signals(folder, hint):
        derivation = folder.finish(scenario.name, order, reporter=reporter, report=report)
    if requested():
        # A signal held until the figures were written: the folder is finished, nothing more runs.
        signal_name, exit_code = interruption()
        raise RunInterrupted(
            signal_name,
            exit_code,
            f"interrupted by {signal_name} after the last request: its figures were finished "
            f"first (summary.json in {run_dir}); not recorded in the ledger",
        )
    if ledger is not None:
        ledger.record(run_dir, derivation.summary, derivation.records)
    return RunOutcome(run_dir=run_dir, derivation=derivation, meta=folder.meta, passes=passes)


_T = TypeVar("_T")


def run_until_stopped(main: Coroutine[Any, Any, _T]) -> _T:
    """`asyncio.run` for a step a signal must stop: a watcher polls the stop request (model.stop)
    every 50 ms and cancels the step's task, so its streams end at an await, its `finally` blocks
    stop the capture workers, and what finished stays written; then KeyboardInterrupt is raised
    here, at the step's boundary, never inside the loop's cleanup. It works off the main thread too
    (a parallel bisection's probes), where no signal handler can be installed."""
    check()

    async def watched() -> _T:
        task = asyncio.current_task()
        assert task is not None

        async def watch() -> None:
            while not requested():
                await asyncio.sleep(0.05)
            task.cancel()

        watcher = asyncio.create_task(watch())
        try:
            return await main
        finally:
            watcher.cancel()

    try:
        result = asyncio.run(watched())
    except asyncio.CancelledError:
        check()
        raise
    check()  # a step that ended by itself while the signal came: stopped here all the same
    return result


def mark_interrupted(folder: RunFolder, finish_with: str) -> None:
    """A folder a signal left with records and no figures, marked so in meta.json with what finishes
    it, so no reader (track add, report) takes it for a finished run: the run's own, a sweep trial
    (its --resume runs it again), a bisect trial (its --resume reruns the probe)."""
    signal_name, _ = interruption()
    folder.mark("interrupted", {"signal": signal_name, "at_unix": time.time(), "finish_with": finish_with})


@contextmanager
def held_signals(folder: RunFolder, finish_with: str) -> Iterator[None]:
    """A step that must not be cut in half, the derivation that writes summary.json and the report:
    a first SIGINT or SIGTERM is only recorded (model.stop, as everywhere), the step runs to its end
    and the caller stops at its boundary, so the folder is finished rather than half-written.

    It cannot check a flag halfway (a synchronous derivation: pandas and file writes), so its time is
    what bounds the exit: ~0.1 s for the hundreds of requests of a usual run, seconds only for runs of
    tens of thousands or replies of tens of MB. A user who will not wait sends a second signal, and
    that one ends the process at once, from the handler and without raising into whatever runs: a
    summary.json it may have cut is removed, meta.json is marked interrupted with `finish_with` (the
    one command that derives it all again from requests.jsonl), the launched servers still up (a
    sweep's or a bisect probe's) are stopped by the exit functions, and the exit code is the first
    signal's."""

    def cut(signum: int) -> None:
        signal_name, exit_code = interruption()
        with contextlib.suppress(OSError, ItlauditError):
            (folder.path / SUMMARY_FILE).unlink(missing_ok=True)
            mark_interrupted(folder, finish_with)
        line = f"itlaudit: interrupted by {signal_name} while deriving the figures: every request is kept; "
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(f"{line}{finish_with}\n")
            sys.stderr.flush()
        atexit._run_exitfuncs()  # the launcher's: stop every server this process started
        os._exit(exit_code)

    with on_second(cut):
        yield


def _finished_requests(run_dir: Path) -> int:
    requests = run_dir / REQUESTS_FILE
    return sum(1 for _ in iter_jsonl(requests)) if requests.exists() else 0


def _wrap_up_failed(folder: RunFolder, scenario: Scenario, reporter: Reporter, error: Exception) -> None:
    """An error ended the run after it began (a capture worker died, the server refused, the disk
    filled): as after an interrupt, meta says so and summary and report are rewritten from what
    finished, so they never disagree with requests.jsonl; nothing goes to the ledger. If that fails
    too (the disk is still full), the original error is the one reported."""
    with contextlib.suppress(OSError, ItlauditError):
        # save() masks it: a server's message in it may quote a key the run sent (a 401).
        folder.mark("failed", {"error": str(error), "at_unix": time.time()})
        finished = _finished_requests(folder.path)
        if finished:
            reporter.phase(f"run failed: keeping the {finished} finished requests")
            folder.finish(scenario.name, [v.name for v in scenario.variants], reporter=reporter)


def _wrap_up_interrupted(folder: RunFolder, scenario: Scenario, reporter: Reporter) -> RunInterrupted:
    """Keep what finished: meta (marked interrupted), summary and report; nothing goes to the ledger,
    since a partial run is not the experiment its fingerprint names."""
    signal_name, exit_code = interruption()
    folder.mark("interrupted", {"signal": signal_name, "at_unix": time.time()})
    finished = _finished_requests(folder.path)
    if finished:
        reporter.phase(f"interrupted by {signal_name}: keeping the {finished} finished requests")
        with held_signals(folder, f"`itlaudit report {folder.path}` derives its figures"):
            folder.finish(scenario.name, [v.name for v in scenario.variants], reporter=reporter)
        where = f"summary and report for them in {folder.path / REPORT_FILE}"
    else:
        where = f"nothing to report ({folder.path})"
    return RunInterrupted(
        signal_name, exit_code, f"interrupted by {signal_name}: {finished} finished requests kept; {where}"
    )
