"""A user's own way to get a server for a commit: an optional build step and a server command.

The build step (e.g. a script that checks out and compiles, or fetches an artifact) failing means the
build is unavailable (skip); the server command is started by the launcher like any other, with
{commit}, {short} and {version} filled here and {port}, {model}, {host} filled by the launcher.
"""

from __future__ import annotations

import dataclasses
import shlex
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from itlaudit.bisect.build_cache import BuildCache
from itlaudit.bisect.build_range import SHORT_SHA, Build
from itlaudit.bisect.providers.base import Found, Prepared, Provider
from itlaudit.errors import BisectError, BuildUnavailable
from itlaudit.model.launch import LaunchKind, LaunchSpec
from itlaudit.model.stop import wait_for
from itlaudit.serve.launcher import fill_placeholders

__all__ = ["CommandProvider", "fill"]

if TYPE_CHECKING:
    from itlaudit.bisect.settings import Settings


def fill(template: list[str], build: Build) -> list[str]:
    values = {"{commit}": build.ref, "{short}": build.ref[:SHORT_SHA], "{version}": build.ref}
    return fill_placeholders(template, values)


class CommandProvider(Provider, name="command"):
    prefetchable: ClassVar[bool] = False

    @classmethod
    def check(cls, settings: Settings) -> None:
        if not settings.server_cmd:
            raise BisectError("--provider command needs --server-cmd 'CMD {commit} ... {port}'")

    @classmethod
    def from_settings(cls, settings: Settings, cache: BuildCache, bisect_dir: Path) -> Provider:
        assert settings.server_cmd is not None  # Settings refuses --provider command without it
        return cls(settings.server_cmd, build_cmd=settings.build_cmd, log_dir=bisect_dir)

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
                    code = wait_for(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))
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
