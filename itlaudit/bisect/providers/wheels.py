"""vLLM's per-commit wheels: https://wheels.vllm.ai/<sha>/[<variant>/]vllm/metadata.json.

Every main-branch commit gets wheels for several backends (cu130, cu129, cpu) and architectures, but
not every variant exists for every commit, and the unsuffixed default moved from cu129 to cu130 in
2026, so variants are tried in the user's order. The chosen wheel is installed by its exact URL: with
an index URL pip merges indices and can install a different vLLM than the commit under test, which is
why the installed version is also checked for the commit's `+g<sha>` local version.
"""

from __future__ import annotations

import dataclasses
import platform
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

from itlaudit.bisect.build_cache import BuildCache
from itlaudit.bisect.build_range import Build
from itlaudit.bisect.providers import venvs
from itlaudit.bisect.providers.base import Found, Prepared, Provider, ProviderOptions
from itlaudit.errors import BuildUnavailable, ItlauditError, ServerStatusError, ServerUnreachableError
from itlaudit.model.jsonvalue import JSONMapping
from itlaudit.model.launch import LaunchKind, LaunchSpec
from itlaudit.side.client import BlockingSideClient

DEFAULT_URL = "https://wheels.vllm.ai"
# "" is the unsuffixed default index; cu130 and cu129 cover both sides of the 2026 default change.
DEFAULT_VARIANTS = ("", "cu130", "cu129")
_LOCAL_SHA = re.compile(r"\+g([0-9a-f]{7,40})")


@dataclass(frozen=True)
class WheelChoice:
    url: str
    filename: str
    variant: str
    platform_tag: str


def metadata_url(base_url: str, commit: str, variant: str) -> str:
    middle = f"{variant}/" if variant else ""
    return f"{base_url.rstrip('/')}/{commit}/{middle}vllm/metadata.json"


def commit_of_version(version: str) -> str | None:
    """`0.23.1rc1.dev471+ge312c5cb2` (or `...+ge312c5cb2.cu130`) -> `e312c5cb2`."""
    match = _LOCAL_SHA.search(version)
    return match.group(1) if match else None


def version_matches(version: str, commit: str) -> bool:
    local = commit_of_version(version)
    return local is not None and (commit.startswith(local) or local.startswith(commit))


def pick_wheel(
    entries: Sequence[JSONMapping], machine: str, page_url: str, variant: str
) -> WheelChoice | None:
    """The vllm wheel built for this machine's architecture; the path is relative to the page."""
    for entry in sorted(entries, key=lambda e: str(e.get("filename", ""))):
        tag = str(entry.get("platform_tag", ""))
        if entry.get("package_name") != "vllm" or not tag.endswith(f"_{machine}"):
            continue
        path = str(entry.get("path") or entry["filename"])
        return WheelChoice(
            url=urljoin(page_url, path),
            filename=str(entry["filename"]),
            variant=variant,
            platform_tag=tag,
        )
    return None


def _fetch_json(url: str, timeout_s: float) -> Any | None:
    """None when the page does not exist (that variant was not built for this commit)."""
    try:
        return BlockingSideClient(timeout_s=timeout_s).request("GET", url).checked().json()
    except ServerStatusError as exc:
        if exc.status in (403, 404):  # S3 answers 403 for a missing key
            return None
        raise BuildUnavailable(f"{url}: HTTP {exc.status}") from None
    except ServerUnreachableError as exc:
        host = urlsplit(url)
        raise Unreachable(f"cannot reach {host.scheme}://{host.netloc} ({exc.reason}): no network?") from None
    except ItlauditError as exc:  # an answer that is not JSON
        raise BuildUnavailable(f"cannot read {url} ({exc})") from None


class Unreachable(BuildUnavailable):
    """The wheel index did not answer at all (no network, a proxy, DNS). Its message names the host,
    not the build, so a dry run that cannot reach it for every build says so once."""


class WheelsOptions(ProviderOptions, frozen=True, kw_only=True, tag="wheels"):
    """--wheels-url, --wheel-variant (tried in order), --pip-arg and --post-install."""

    wheels_url: str = DEFAULT_URL
    wheel_variants: tuple[str, ...] = DEFAULT_VARIANTS
    pip_args: tuple[str, ...] = ()
    post_install: tuple[str, ...] | None = None

    def provider(self, cache: BuildCache, log_dir: Path) -> Provider:
        return WheelsProvider(
            cache,
            base_url=self.wheels_url,
            variants=self.wheel_variants,
            pip_args=list(self.pip_args),
            fixups=list(self.post_install or ()),
        )


class WheelsProvider(Provider, name="wheels"):
    def __init__(
        self,
        cache: BuildCache,
        *,
        base_url: str = DEFAULT_URL,
        variants: tuple[str, ...] = DEFAULT_VARIANTS,
        machine: str | None = None,
        pip_args: list[str] | None = None,
        fixups: list[str] | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self.cache = cache
        self.base_url = base_url
        self.variants = variants
        self.machine = machine or platform.machine()
        self.pip_args = pip_args or []
        self.fixups = fixups or []
        self.timeout_s = timeout_s

    def _key(self, build: Build, variant: str) -> str:
        return f"{build.ref}-{variant or 'default'}-{self.machine}"

    def resolve(self, build: Build) -> WheelChoice:
        """The first variant index with a wheel for this machine; the skip reason lists what was tried."""
        tried: list[str] = []
        for variant in self.variants:
            url = metadata_url(self.base_url, build.ref, variant)
            entries = _fetch_json(url, self.timeout_s)
            if entries is None:
                tried.append(f"{variant or 'default'}: no index")
                continue
            choice = pick_wheel(entries if isinstance(entries, list) else [], self.machine, url, variant)
            if choice is not None:
                return choice
            tried.append(f"{variant or 'default'}: no {self.machine} wheel")
        raise BuildUnavailable(f"no wheel for {build.label} on {self.base_url} ({'; '.join(tried)})")

    def find(self, build: Build) -> Found:
        """The metadata.json lookup `prepare` makes, plus a HEAD of the wheel for its size."""
        try:
            choice = self.resolve(build)
        except BuildUnavailable as exc:
            return Found(False, str(exc))
        size = None
        try:
            answer = BlockingSideClient(timeout_s=self.timeout_s).request("HEAD", choice.url).checked()
            length = answer.headers.get("content-length")
            size = int(length) if length and length.isdigit() else None
        except ItlauditError:
            pass  # the wheel is listed; its size is only an estimate's input
        return Found(True, f"{choice.variant or 'default'}: {choice.filename}", size)

    def prepare(self, build: Build) -> Prepared:
        for variant in self.variants:
            key = self._key(build, variant)
            data = self.cache.lookup(self.name, key)
            if data is not None:
                return Prepared(build, data["version"], data)
        choice = self.resolve(build)
        key = self._key(build, choice.variant)
        with self.cache.pinned(self.name, key):
            root = self.cache.fresh(self.name, key)
            python = venvs.install(
                root, [choice.url], pip_args=self.pip_args, fixups=self.fixups, label=build.label
            )
            version = venvs.dist_version(python, "vllm", root / venvs.INSTALL_LOG)
            if not version_matches(version, build.ref):
                raise BuildUnavailable(
                    f"{choice.filename} installed vllm {version}, which does not carry commit {build.label}"
                )
            data = self.cache.complete(
                self.name,
                key,
                {
                    "python": str(python),
                    "version": version,
                    "url": choice.url,
                    "filename": choice.filename,
                    "variant": choice.variant,
                    "platform_tag": choice.platform_tag,
                },
            )
            self.cache.evict()
        return Prepared(build, version, data)

    def launch_spec(self, prepared: Prepared, base: LaunchSpec) -> LaunchSpec:
        return dataclasses.replace(base, kind=LaunchKind.PYTHON, python=prepared.info["python"])
