"""Build providers: each turns one commit or version into a server the launcher can start.

Providers only find, fetch and install; starting and stopping the server stays the launcher's job,
so every provider inherits its guaranteed process-group teardown. `prepare` is the slow, cacheable
part (a download, a pip install) and may run in the background for the next candidates; it raises
BuildUnavailable for anything that means "this build cannot be had", which the search treats as skip.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from itlaudit.bisect.build_range import Build
from itlaudit.serve.launcher import LaunchSpec


@dataclass(frozen=True)
class Prepared:
    """A build ready to launch: `version` is what the installed build reports, when it can tell."""

    build: Build
    cache_key: str | None = None
    version: str | None = None
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Found:
    """What metadata alone says about a build (for --dry-run): `available` None means it cannot be
    told without running the install or build step."""

    available: bool | None
    detail: str
    size_bytes: int | None = None


class Provider(ABC):
    name: ClassVar[str]
    # Worth preparing ahead: there is something slow to do before a launch.
    prefetchable: ClassVar[bool] = True

    @abstractmethod
    def prepare(self, build: Build) -> Prepared:
        """Find, fetch and install the build (idempotent through the cache); BuildUnavailable if not."""

    @abstractmethod
    def find(self, build: Build) -> Found:
        """Look the build up without downloading or installing anything."""

    @abstractmethod
    def launch_spec(self, prepared: Prepared, base: LaunchSpec) -> LaunchSpec:
        """The base spec (model, server args, env from the scenario) pointed at this build."""
