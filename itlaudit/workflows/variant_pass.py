"""One variant's pass over its server, the one way every command measures a variant: `run`, `compare`
and `smoke` (through run_scenario), each `sweep` trial and each bisect trial.

A pass is one `async def` on one event loop with one side-request session (side/client.py), doing,
in this order:

1. model: resolve the scenario's `model` against /v1/models (once);
2. identity: with a ledger, the server's build (/version, a one-token completion's fingerprint) and
   the ledger's repeat check, before anything of the workload reaches the server;
3. cache reset: POST /reset_prefix_cache when the variant asks for it;
4. planning: prompts checked against the served context, reply lengths and random chat prompts fitted
   through /tokenize, every request built; the planned workload (what is sent) goes to meta.json;
5. capture: the warmup phase, then the measured window, the window hooks called around it;
6. /version: the server's environment record, after the window so it is not counted in it.

The window hooks (`WindowHook`) are where a /metrics window (compare's spec-decode counters) and a
/metrics sampler plug in: `opened` runs after the warmup and before the first measured request,
`closed` after the last one, each off the loop (blocking calls allowed).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.console import Console

from itlaudit.capture.described import CaptureDescription
from itlaudit.capture.runner import (
    CaptureOptions,
    CapturePlan,
    CaptureResult,
    OnCapture,
    OnDone,
    capture,
    plan_capture,
    variant_access,
)
from itlaudit.errors import ItlauditError
from itlaudit.model.access import Access
from itlaudit.model.launch import LaunchSpec
from itlaudit.model.records import Status
from itlaudit.model.run_context import workload_meta
from itlaudit.model.scenario import Scenario, Variant
from itlaudit.serve.launcher import engine_error, local_model_config
from itlaudit.store.jsonl import RecordWriter
from itlaudit.telemetry.window import Telemetry, TelemetryRecord, TelemetryWindow
from itlaudit.workflows.ledger import LedgerPolicy
from itlaudit.workflows.server import VariantServer

if TYPE_CHECKING:
    from itlaudit.capture.planning import OnPrepare
    from itlaudit.workflows.run_folder import RunFolder


class WindowHook:
    """Called around a variant's measured window; a subclass overrides what it needs. What a call
    returns (None: nothing) is added to the variant's meta.json entry."""

    def opened(self, variant: str, base_url: str, folder: RunFolder) -> Mapping[str, object] | None:
        """After the warmup, before the first measured request."""
        return None

    def closed(self, variant: str, base_url: str, folder: RunFolder) -> Mapping[str, object] | None:
        """After the last measured request."""
        return None


class TelemetryHook(WindowHook):
    """The command line's telemetry (--metrics-period, --gpu, --profile: telemetry/window.py) as a
    window hook: its samplers start as the window opens; what they wrote is named in meta.json."""

    def __init__(
        self,
        telemetry: Telemetry,
        access: Access,
        launched: LaunchSpec | None,
        say: Callable[[str], None],
    ) -> None:
        self.telemetry = telemetry
        self.access = access
        self.launched = launched
        self.say = say
        self.window: TelemetryWindow | None = None

    def opened(self, variant: str, base_url: str, folder: RunFolder) -> Mapping[str, object] | None:
        self.window = self.telemetry.window(
            variant, base_url, folder.path, access=self.access, launched=self.launched, say=self.say
        )
        self.window.start()
        return None

    def closed(self, variant: str, base_url: str, folder: RunFolder) -> TelemetryRecord | None:
        return self.window.stop() if self.window is not None else None


@dataclass(frozen=True)
class PassResult:
    """What one pass did: the served model, what it planned (the workload as sent) and captured, and
    the server's /version after the window (None where it has none): what its caller reads instead of
    the meta.json the pass wrote it to."""

    model: str
    plan: CapturePlan
    capture: CaptureResult
    version: str | None = None

    def __repr__(self) -> str:
        # asyncio.run formats its finished task's repr (result included) when it restores the SIGINT
        # handler (CPython's signal module turns the old handler into an Enum and fails): the default
        # dataclass repr of every record and chunk cost 0.2 s a pass at 1024 requests x 100 chunks.
        return f"PassResult(model={self.model!r}, records={len(self.capture.records)})"


@dataclass
class VariantPass:
    """One variant of `scenario` measured on its `server` (workflows/server.py: where it answers, and
    the launch and log when itlaudit started it), its records landing in `writer` (the folder's
    requests.jsonl) and its meta.json entry in `folder`. `id_tag` is an --append round's tag.
    `on_done`, `on_prepare` and `on_capture` are the progress display's."""

    scenario: Scenario
    variant: Variant
    server: VariantServer
    folder: RunFolder
    writer: RecordWriter
    capture: CaptureOptions | None = None
    ledger: LedgerPolicy | None = None
    console: Console | None = None
    hooks: Sequence[WindowHook] = ()
    id_tag: str | None = None
    on_done: OnDone | None = None
    on_prepare: OnPrepare | None = None
    on_capture: OnCapture | None = None

    async def run(self) -> PassResult:
        """The pass, in the module's stated order, on one side-request session."""
        from itlaudit.capture.planning import reset_prefix_cache, resolve_model
        from itlaudit.capture.server_info import VERSION_TIMEOUT_S, server_identity
        from itlaudit.side.client import SideClient

        name, base_url, folder = self.variant.name, self.server.url, self.folder
        options = self.capture or CaptureOptions()
        access = variant_access(self.scenario, name, options)
        info = folder.variant(name, access)
        info.url = base_url
        folder.save()
        async with SideClient(access) as client:
            model = await resolve_model(client, base_url, self.scenario.model)
            if self.ledger is not None:
                identity = await server_identity(client, base_url, model)
                info.fingerprint = self.ledger.check(
                    self.scenario, name, base_url, identity, folder.path, self.console
                )
            if self.variant.reset_prefix_cache:
                reset = await reset_prefix_cache(client, base_url)
                info.reset_prefix_cache = reset
                if reset.get("note"):
                    self._note(f"{name}: {reset['note']}")
            plan = await plan_capture(
                client,
                self.scenario,
                name,
                base_url,
                model,
                id_tag=self.id_tag,
                on_prepare=self.on_prepare,
            )
            if plan.scenario is not self.scenario:
                info.workload = workload_meta(plan.scenario)  # what was sent, fitted to this server

            def described(workers: CaptureDescription) -> None:
                """Capture workers (pids, clock offsets) reach meta.json before they stream."""
                info.update(workers)
                folder.save()
                if self.on_capture is not None:
                    self.on_capture(workers)

            hooks = [*self.hooks, TelemetryHook(options.telemetry, access, self.server.launched, self._note)]
            opened: list[WindowHook] = []

            def open_window() -> None:
                for hook in hooks:
                    opened.append(hook)
                    info.update(hook.opened(name, base_url, folder) or {})

            def close_window() -> None:
                for hook in reversed(opened):
                    info.update(hook.closed(name, base_url, folder) or {})
                folder.save()

            try:
                captured = await capture(
                    plan,
                    self.writer,
                    self.on_done,
                    options=options,
                    on_capture=described,
                    on_warm=open_window,
                )
            finally:
                # Closed however the capture ended (a sampler's thread, a profile must not outlive
                # it), off the loop like the opening: a hook may make blocking requests.
                await asyncio.get_running_loop().run_in_executor(None, close_window)
            try:
                version = await client.version(base_url, timeout_s=VERSION_TIMEOUT_S)
            except ItlauditError:
                version = None  # a server without /version (SGLang, a gateway) still has a record
        launched = self.server.launched
        if launched is not None and launched.dummy_weights:
            info.load_format = "dummy"  # gibberish by construction (analysis.validity's phrase)
        if launched is not None and any(r.status != Status.OK for r in captured.records):
            log = self.server.log_path or folder.server_log(name)
            cause = engine_error(log)
            if cause is not None:  # a server that failed its requests and says why: said in one line
                info.server_error = cause
                self._note(f"{name}: requests failed; its server's log ends in {cause} ({log.name})")
        # How it speculates (judged by analysis.validity: synthetic; named in the report's context:
        # a dynamic schedule): a declared config, else a launched server's arguments, whose absence
        # is speculation off (null); a server given by URL and declaring nothing leaves it unknown.
        if launched is not None and launched.model and (config := local_model_config(launched.model)):
            info.model_config = config  # the bandwidth floor's, where the run named none
        if self.variant.speculative_config is not None or launched is not None:
            info.speculative_config = self.variant.speculation
        info.environment = self.server.environment(version, [r.system_fingerprint for r in captured.records])
        folder.save()
        return PassResult(model=model, plan=plan, capture=captured, version=version)

    def _note(self, note: str) -> None:
        """A line worth the reader's eye, naming its variant."""
        if self.console is not None:
            self.console.print(note, markup=False, soft_wrap=True)
