"""What every build provider is: the interface and the registry the `--provider` names come from."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from itlaudit.bisect.build_cache import BuildCache, BuildInfo
from itlaudit.bisect.build_range import Build
from itlaudit.errors import BisectError
from itlaudit.model.launch import LaunchSpec
from itlaudit.model.registry import Registry

if TYPE_CHECKING:
    from itlaudit.bisect.settings import Settings

__all__ = ["PROVIDERS", "Found", "Prepared", "Provider"]


@dataclass(frozen=True)
class Prepared:
    """A build ready to launch: `version` is what the installed build reports, when it can tell."""

    build: Build
    version: str | None = None
    info: BuildInfo = field(default_factory=lambda: BuildInfo())


@dataclass(frozen=True)
class Found:
    """What metadata alone says about a build (for --dry-run): `available` None means it cannot be
    told without running the install or build step."""

    available: bool | None
    detail: str
    size_bytes: int | None = None


class Provider(ABC):
    """`class XProvider(Provider, name="x")` files the provider in PROVIDERS under `--provider x`."""

    name: ClassVar[str]
    # Worth preparing ahead: there is something slow to do before a launch.
    prefetchable: ClassVar[bool] = True
    # Builds are release versions (a package index), not commits.
    by_version: ClassVar[bool] = False

    def __init_subclass__(cls, name: str = "", **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if name:
            cls.name = name
            PROVIDERS.register(name)(cls)

    @classmethod
    def check(cls, settings: Settings) -> None:
        """Refuse options this provider cannot run with (BisectError), before any build is touched;
        most providers take whatever the options say."""
        return None

    @classmethod
    @abstractmethod
    def from_settings(cls, settings: Settings, cache: BuildCache, bisect_dir: Path) -> Provider:
        """The provider as the bisection's options configure it (bisect_dir holds its logs)."""

    @abstractmethod
    def prepare(self, build: Build) -> Prepared:
        """Find, fetch and install the build (idempotent through the cache); BuildUnavailable if not."""

    @abstractmethod
    def find(self, build: Build) -> Found:
        """Look the build up without downloading or installing anything."""

    @abstractmethod
    def launch_spec(self, prepared: Prepared, base: LaunchSpec) -> LaunchSpec:
        """The base spec (model, server args, env from the scenario) pointed at this build."""


PROVIDERS: Registry[type[Provider]] = Registry("--provider", BisectError)
