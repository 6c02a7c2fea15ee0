"""One server lifecycle for every command that measures or scores a variant: `run`, `compare` (its
scoring server too), each `sweep` variant, each bisect and nightly probe, `smoke` and the invariance
audit open the variant's server through `VariantServer.open` and nothing else.

Opening attaches to a URL (--url/--variant, or the scenario's `url`) or launches the variant's
server (serve/launcher.py: its log in the folder, its processes tagged with the folder, its
credentials masked in that log when it stops); leaving the block stops what was launched. The
server's environment record (what meta.json and smoke.json say about it) is built here from what the
lifecycle knows (launched or not, its kind, env and log) and what a pass read (/version, the
fingerprints), so the two commands that write one cannot tell it differently.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

from itlaudit.errors import ScenarioError
from itlaudit.model.access import NO_ACCESS, Access
from itlaudit.model.launch import LaunchSpec
from itlaudit.model.meta import EnvironmentRecord
from itlaudit.model.scenario import Variant
from itlaudit.report.progress import Reporter
from itlaudit.store.rundir import server_log_name

RUN_DIR_ENV = "ITLAUDIT_RUN_DIR"


@dataclass(frozen=True)
class VariantServer:
    """A variant's server while its block lasts: where it answers, and, when itlaudit launched it, the
    launch it ran (`launched`), its log and its pid."""

    name: str
    url: str
    launched: LaunchSpec | None = None
    log_path: Path | None = None
    pid: int | None = None

    @classmethod
    @contextmanager
    def open(
        cls,
        variant: Variant,
        folder: Path,
        *,
        url: str | None = None,
        access: Access = NO_ACCESS,
        spec: LaunchSpec | None = None,
        reporter: Reporter | None = None,
    ) -> Iterator[VariantServer]:
        """The variant's server: `url` (a command-line override) first, else a launch (`spec`, a
        bisect probe's build, or the variant's own [launch]) with its log in `folder`, else the
        variant's `url`; a variant with none of them is one line naming the fix."""
        if url:
            yield cls(variant.name, url)
            return
        launch_with = spec if spec is not None else variant.launch
        if launch_with is not None:
            from itlaudit.serve.launch_config import launch_spec
            from itlaudit.serve.launcher import launch

            ready = launch_spec(launch_with)
            # Tags the server's processes with the folder that owns them, so a leftover is traceable.
            ready.env[RUN_DIR_ENV] = str(folder.resolve())
            log_path = folder / server_log_name(variant.name)
            starting = reporter.step(f"{variant.name}: starting its server") if reporter else None
            with starting or nullcontext():
                server = launch(ready, log_path, access)
            with server:
                yield cls(variant.name, server.url, ready, log_path, server.pid)
            return
        if variant.url:
            yield cls(variant.name, variant.url)
            return
        raise ScenarioError(
            f"variant {variant.name!r} has no `url` and no [variants.launch]; add one, or pass --url / "
            f"--variant {variant.name}=URL"
        )

    def environment(self, version: str | None, fingerprints: Sequence[str | None]) -> EnvironmentRecord:
        """The server's environment record: its /version (None: it has none), the fingerprints its
        replies carried, and for a launched server its kind, environment and log."""
        from itlaudit.capture.server_info import environment_record

        launched = self.launched
        return environment_record(
            self.url,
            version,
            list(fingerprints),
            launch_env=launched.env if launched else None,
            launch_kind=launched.kind if launched else None,
            log_path=self.log_path,
        )
