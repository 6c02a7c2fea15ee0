"""What every build provider is: the interface, and the base of the per-provider option structs
whose tags are the `--provider` names."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import msgspec

from itlaudit.bisect.build_cache import BuildCache, BuildInfo
from itlaudit.bisect.build_range import Build
from itlaudit.model.launch import LaunchSpec


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


class ProviderOptions(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind"):
    """One provider's own options, a struct per provider (`class XOptions(ProviderOptions, tag="x")`,
    guidellm's per-backend argument models): bisect.json stores them tagged with the `--provider`
    name, so a setting of one provider never rides along with another's. The field names are the
    keys bisect.json kept flat before format 4, so an older file reads back by name."""

    # Builds are release versions (a package index), not commits.
    by_version: ClassVar[bool] = False

    @property
    def kind(self) -> str:
        """The `--provider` name: the struct's tag."""
        return str(type(self).__struct_config__.tag)

    def provider(self, cache: BuildCache, log_dir: Path) -> Provider:
        """The provider these options configure (`log_dir` holds its logs); each struct has its own."""
        raise NotImplementedError(type(self).__name__)


class Provider(ABC):
    """`class XProvider(Provider, name="x")`: `name` is its part of the build cache, as `--provider`
    names it; its options struct (`ProviderOptions`) builds it."""

    name: ClassVar[str]
    # Worth preparing ahead: there is something slow to do before a launch.
    prefetchable: ClassVar[bool] = True

    def __init_subclass__(cls, name: str = "", **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if name:
            cls.name = name

    @abstractmethod
    def prepare(self, build: Build) -> Prepared:
        """Find, fetch and install the build (idempotent through the cache); BuildUnavailable if not."""

    @abstractmethod
    def find(self, build: Build) -> Found:
        """Look the build up without downloading or installing anything."""

    @abstractmethod
    def launch_spec(self, prepared: Prepared, base: LaunchSpec) -> LaunchSpec:
        """The base spec (model, server args, env from the scenario) pointed at this build."""
