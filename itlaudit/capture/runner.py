"""Coordinates one variant's capture: plans the requests, starts the capture workers, and lands every
record they finish in requests.jsonl as it arrives.

I/O only: records here are raw; the figures derived from them come from `analysis.derive.derive_request`, a
pure function, after the run. The coordinator's own loop does no stamping (the workers do), so
progress and record merging here cannot disturb what is measured.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec

from itlaudit.capture.described import CaptureDescription, LostWorker, RandomChat, WorkerDescription
from itlaudit.errors import ServerRejectedError
from itlaudit.model.access import Access
from itlaudit.model.datasets import REPLY_KINDS
from itlaudit.model.records import RequestRecord
from itlaudit.model.redact import known_secrets, redact_bytes
from itlaudit.model.scenario import Scenario
from itlaudit.model.vocabulary import DEFAULT_STAMP, StampMode
from itlaudit.side.client import SideClient
from itlaudit.store.jsonl import RecordWriter
from itlaudit.telemetry.window import Telemetry

if TYPE_CHECKING:
    from itlaudit.capture.environment import CaptureEnvironment
    from itlaudit.capture.planning import OnPrepare
    from itlaudit.capture.request_plan import PlannedRequest
    from itlaudit.side.client import SideClient

OnDone = Callable[[], None]  # one more record landed (progress: decoding waits until the capture ends)
OnCapture = Callable[[CaptureDescription], None]


@dataclass(frozen=True)
class CaptureOptions:
    """How a command captures: `workers` None is auto; `timeouts` overrides the scenario's [workload]
    limits by name; `stamp` "kernel" falls back to "loop" where the platform lacks kernel receive
    timestamps. Built from the command line in one place (cli/options.py, which checks each value and
    speaks the flags' names); the defaults here are what a command that streams without them gets."""

    workers: int | None = None
    timeouts: dict[str, float] = field(default_factory=dict)
    stamp: StampMode = DEFAULT_STAMP
    access: Access = field(default_factory=Access)
    cluster: str | None = None  # None: local processes; "auto" or "ray://HOST:PORT": Ray actors
    telemetry: Telemetry = field(default_factory=Telemetry)  # watched beside the measured window

    def environment(self) -> CaptureEnvironment:
        """Where the workers run: this machine's processes or the Ray cluster, chosen here alone."""
        from itlaudit.capture.environment import capture_environment  # the workers' stack: only to run

        return capture_environment(self.cluster)


def variant_access(scenario: Scenario, variant: str, options: CaptureOptions | None) -> Access:
    """The command line's headers and TLS, with the variant's own `headers` over them."""
    access = options.access if options is not None else Access()
    headers = next((v.headers for v in scenario.variants if v.name == variant), {})
    return access.with_headers(headers)


@dataclass(frozen=True)
class CapturePlan:
    """What a variant's capture will send, decided before its first request: the scenario as planned
    (a token-id dataset on chat carries the texts fitted through this server's tokenizer, so this,
    not the scenario the command was given, is the workload that was sent), every request, and how
    the reply lengths and chat prompts were arrived at (meta.json's `reply_lengths`, `random_chat`)."""

    scenario: Scenario
    variant: str
    base_url: str
    requests: list[PlannedRequest]
    reply_lengths: str | None = None  # "tokenize" or "estimated" for a dataset of replies
    random_chat: RandomChat | None = None

    def described(self) -> CaptureDescription:
        """The plan's part of the workers' description that meta.json records."""
        found = CaptureDescription()
        if self.reply_lengths is not None:
            found["reply_lengths"] = self.reply_lengths
        if self.random_chat is not None:
            found["random_chat"] = self.random_chat
        return found


@dataclass(frozen=True)
class CaptureResult:
    """What a capture did: its records in request-id order, and the capture processes (or Ray actors)
    of each phase as meta.json describes them (pid, clock offset, node), with any that were lost."""

    records: list[RequestRecord]
    workers: list[WorkerDescription] = field(default_factory=list)
    warmup_workers: list[WorkerDescription] = field(default_factory=list)
    lost_workers: list[LostWorker] = field(default_factory=list)


async def plan_capture(
    client: SideClient,
    scenario: Scenario,
    variant: str,
    base_url: str,
    model: str,
    *,
    id_tag: str | None = None,
    on_prepare: OnPrepare | None = None,
) -> CapturePlan:
    """Plan the variant's requests on the pass's side-request client: prompts checked against the
    served model's context, reply lengths counted and random chat prompts fitted through its
    /tokenize, then each request built. `id_tag` (an --append round) makes ids `<variant>.<tag>-<index>`:
    unique beside an earlier round's, still ending in the prompt index that pairs requests across
    variants. `on_prepare` hears the progress of this (tokenising prompts, encoding the bodies), which
    a Ctrl-C ends."""
    from itlaudit.capture.planning import check_prompts_fit, plan_variant, reply_lengths
    from itlaudit.capture.tokenizer import random_chat_prompts

    await check_prompts_fit(client, base_url, model, scenario)
    lengths = await reply_lengths(client, base_url, model, scenario, on_prepare)
    chat_prompts = await random_chat_prompts(client, base_url, model, scenario, on_prepare)
    if chat_prompts is not None:
        scenario = chat_prompts.scenario
    requests = await plan_variant(scenario, variant, base_url, model, id_tag, lengths, on_prepare)
    dataset = scenario.workload.dataset
    return CapturePlan(
        scenario=scenario,
        variant=variant,
        base_url=base_url,
        requests=requests,
        reply_lengths=(
            ("tokenize" if lengths is not None else "estimated")
            if dataset is not None and dataset.kind in REPLY_KINDS
            else None
        ),
        random_chat=chat_prompts.describe() if chat_prompts is not None else None,
    )


async def capture(
    plan: CapturePlan,
    writer: RecordWriter,
    on_done: OnDone | None = None,
    *,
    options: CaptureOptions | None = None,
    on_capture: OnCapture | None = None,
    on_warm: Callable[[], None] | None = None,
) -> CaptureResult:
    """Send the plan at the scenario's concurrency over the capture workers. Each record is handed to
    `writer` the moment its worker reports it; `on_capture` receives the workers' description (clock
    offsets) for meta.json before they stream.

    Warmup requests are a phase of their own that finishes before the first measured request is sent:
    sent beside the measured ones, they would share (not absorb) the cold first batch. `on_warm` runs
    between the phases (blocking calls allowed: it runs off the loop), which is where a /metrics
    window must open so that the server's counters cover exactly the requests the figures count."""
    from itlaudit.capture.client import StreamOptions
    from itlaudit.capture.workers import rejected, split_shares, worker_count

    options = options or CaptureOptions()
    scenario, base_url = plan.scenario, plan.base_url
    workload = scenario.workload
    access = variant_access(scenario, plan.variant, options)
    loop = asyncio.get_running_loop()
    environment = options.environment()
    cores = await environment.cores(options.workers)
    timeouts = dataclasses.replace(workload.timeouts, **options.timeouts)
    # duration_s ends the measured phase: nothing is sent after it, and a stream still open when its
    # grace is over too is cut (a timeout record, limit duration_cut_s), whenever it began.
    measured_timeouts = dataclasses.replace(timeouts, duration_cut_s=workload.arrivals.cut_after_s)
    described = plan.described()
    seen = CaptureDescription()

    def told(description: CaptureDescription) -> None:
        """What meta.json hears, kept for the result too."""
        seen.update(description)
        if on_capture is not None:
            on_capture(description)

    secrets = tuple(value.encode() for value in known_secrets())  # a server may echo any of them
    lander = RecordLander(writer, on_done, secrets)
    warmup = [request for request in plan.requests if request.warmup]
    measured = [request for request in plan.requests if not request.warmup]
    for phase in (warmup, measured):
        if phase is measured and on_warm is not None:
            await loop.run_in_executor(None, on_warm)
        if not phase:
            continue
        count = worker_count(options.workers, workload.concurrency, len(phase), cores)
        sending = StreamOptions(measured_timeouts if phase is measured else timeouts, options.stamp, access)
        shares = split_shares(
            phase,
            workload.concurrency,
            sending,
            count,
            duration_s=workload.arrivals.duration_s if phase is measured else None,
        )
        # The warmup phase's workers (other processes, other clock offsets) go to meta.json under
        # their own key: `worker` on a warmup record indexes that list.
        report = told if phase is measured else _as_warmup_workers(told)
        await environment.run(shares, lander, described, report)
    records = lander.records
    refused = [r for r in records if rejected(r)]
    if refused and len(refused) == len(records):
        first = refused[0]
        raise ServerRejectedError(
            f"{base_url} rejected the request with HTTP {first.http_status}: {first.error} "
            "(fix the scenario's workload or URL; the rejected request is kept in requests.jsonl)"
        )
    return CaptureResult(
        records=sorted(records, key=lambda r: r.request_id),
        workers=list(seen.get("workers", [])),
        warmup_workers=list(seen.get("warmup_workers", [])),
        lost_workers=list(seen.get("lost_workers", [])),
    )


class RecordLander:
    """Where the workers' JSON lines land: each goes to requests.jsonl unchanged (no re-encoding) unless
    a server echoed a credential we sent (a 401's message), which is masked. Bytes come per worker and
    may end mid-line.

    Lines are decoded into records only when `records` is read, after the capture: on a machine whose
    cores the capture workers and the server already share, the coordinator decoding 64 long records
    as their streams end took CPU from the workers still stamping the last chunks of theirs."""

    def __init__(self, writer: RecordWriter, on_done: OnDone | None, secrets: tuple[bytes, ...] = ()) -> None:
        self.writer = writer
        self.on_done = on_done
        self.secrets = secrets
        self._pending: dict[int, bytearray] = {}
        self._lines: list[bytes] = []
        self._records: list[RequestRecord] = []

    @property
    def records(self) -> list[RequestRecord]:
        """Every record landed so far, in landing order."""
        for line in self._lines:
            self._records.append(RequestRecord.from_json(msgspec.json.decode(line)))
        self._lines.clear()
        return self._records

    def feed(self, worker: int, data: bytes) -> None:
        pending = self._pending.setdefault(worker, bytearray())
        pending.extend(data)
        end = pending.rfind(b"\n")
        if end < 0:
            return
        lines = bytes(pending[:end]).split(b"\n")
        del pending[: end + 1]
        for line in lines:
            if self.secrets:
                line = redact_bytes(line, self.secrets)
            self.writer.write(line)
            self._lines.append(line)
            self._landed()
        self.writer.check()

    def add(self, record: RequestRecord) -> None:
        """A record the coordinator made itself (a lost worker's unfinished request)."""
        self.writer.write(record.to_json())
        self.records.append(record)
        self._landed()

    def _landed(self) -> None:
        if self.on_done is not None:
            self.on_done()


def _as_warmup_workers(report: OnCapture) -> OnCapture:
    """The warmup phase's description, filed apart from the measured phase's workers."""

    def warmup_workers(described: CaptureDescription) -> None:
        filed = CaptureDescription()
        if "workers" in described:
            filed["warmup_workers"] = described["workers"]
        if "lost_workers" in described:
            filed["warmup_lost_workers"] = described["lost_workers"]
        report(filed)

    return warmup_workers
