"""A user's own way to get a server for a commit: an optional build step and a server command.

The build step (e.g. a script that checks out and compiles, or fetches an artifact) failing means the
build is unavailable (skip); the server command is started by the launcher like any other, with
{commit}, {short} and {version} filled here and {port}, {model}, {host} filled by the launcher.
"""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path
from typing import ClassVar

from itlaudit.bisect.build_cache import BuildCache
from itlaudit.bisect.build_range import SHORT_SHA, Build
from itlaudit.bisect.providers.base import Found, Prepared, Provider, ProviderOptions
from itlaudit.errors import BuildUnavailable
from itlaudit.model.launch import LaunchKind, LaunchSpec
from itlaudit.model.stop import run_stoppable
from itlaudit.serve.launcher import fill_placeholders


def fill(template: list[str], build: Build) -> list[str]:
    values = {"{commit}": build.ref, "{short}": build.ref[:SHORT_SHA], "{version}": build.ref}
    return fill_placeholders(template, values)


class CommandOptions(ProviderOptions, frozen=True, kw_only=True, tag="command"):
    """--server-cmd (required: the provider has no other way to a server) and --build-cmd."""

    server_cmd: str
    build_cmd: str | None = None

    def provider(self, cache: BuildCache, log_dir: Path) -> Provider:
        return CommandProvider(self.server_cmd, build_cmd=self.build_cmd, log_dir=log_dir)


class CommandProvider(Provider, name="command"):
    prefetchable: ClassVar[bool] = False

    def __init__(self, server_cmd: str, *, build_cmd: str | None = None, log_dir: Path) -> None:
        self.server_cmd = shlex.split(server_cmd)
        if not self.server_cmd:
            raise BuildUnavailable("--server-cmd is empty")
        self.build_cmd = shlex.split(build_cmd) if build_cmd else []
        self.log_dir = log_dir

    def find(self, build: Build) -> Found:
        if self.build_cmd:
            return Found(None, "known only by running --build-cmd")
        return Found(True, f"served by {' '.join(fill(self.server_cmd, build))}")

    def prepare(self, build: Build) -> Prepared:
        if self.build_cmd:
            argv = fill(self.build_cmd, build)
            self.log_dir.mkdir(parents=True, exist_ok=True)
            log_path = self.log_dir / f"build-{build.label}.log"
            with log_path.open("ab") as log:
                try:
                    code = run_stoppable(argv, log)
                except OSError as exc:
                    raise BuildUnavailable(f"build command {argv[0]!r} cannot start ({exc})") from None
            if code != 0:
                raise BuildUnavailable(f"build command exited {code} for {build.label}; see {log_path}")
        return Prepared(build, None, {"argv": fill(self.server_cmd, build)})

    def launch_spec(self, prepared: Prepared, base: LaunchSpec) -> LaunchSpec:
        """The variant's server arguments (e.g. K3's --speculative-config) follow the command, where
        a vLLM server takes them."""
        return dataclasses.replace(
            base, kind=LaunchKind.COMMAND, command=[*prepared.info["argv"], *base.server_args], server_args=[]
        )
