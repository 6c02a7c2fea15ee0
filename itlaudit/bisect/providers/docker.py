"""A docker image per commit: `vllm/vllm-openai:nightly-<sha>`, then the release repository's
per-architecture tags. A tag that cannot be pulled is an unavailable build, not a bad one.

Images live in the docker engine, not in the cache folder, so the cache entry only records the image
and its size (counted against --cache-size) and eviction removes the image with `docker rmi`.
The registry's commands (a manifest check, a pull: minutes) run as the pip provider's install does
(model.stop.run_stoppable), so a signal ends them within the 5 s an interrupt has.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import subprocess
import tempfile
from pathlib import Path

from itlaudit.bisect.build_cache import BuildCache, BuildInfo
from itlaudit.bisect.build_range import SHORT_SHA, Build
from itlaudit.bisect.providers.base import Found, Prepared, Provider, ProviderOptions
from itlaudit.errors import BuildUnavailable
from itlaudit.model.launch import LaunchKind, LaunchSpec
from itlaudit.model.stop import run_stoppable
from itlaudit.serve.launcher import fill_placeholders
from itlaudit.serve.logged import run_logged

DEFAULT_IMAGES = (
    "vllm/vllm-openai:nightly-{commit}",
    "public.ecr.aws/q9t5s3a7/vllm-release-repo:{commit}-{arch}",
)
PULL_LOG = "pull.log"


def image_candidates(patterns: tuple[str, ...], build: Build, arch: str) -> list[str]:
    """Fill {commit} (full sha or version), {short} and {arch}; plain replacement like the launcher."""
    values = {"{commit}": build.ref, "{short}": build.ref[:SHORT_SHA], "{arch}": arch}
    return fill_placeholders(list(patterns), values)


def release_image(data: BuildInfo) -> None:
    """Evicted from the cache: remove the image too, or the size limit would free no disk."""
    subprocess.run(
        [str(data.get("docker", "docker")), "rmi", str(data["image"])],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )


def _layer_bytes(manifest_json: str) -> int | None:
    """Compressed layer sizes of `docker manifest inspect -v` output (one object, or a list per platform:
    the first is taken)."""
    try:
        data = json.loads(manifest_json)
    except ValueError:
        return None
    entry = data[0] if isinstance(data, list) and data else data
    manifest = entry.get("SchemaV2Manifest", entry) if isinstance(entry, dict) else {}
    layers = manifest.get("layers", []) if isinstance(manifest, dict) else []
    sizes = [layer.get("size") for layer in layers if isinstance(layer, dict)]
    return sum(s for s in sizes if isinstance(s, int)) or None


class DockerOptions(ProviderOptions, frozen=True, kw_only=True, tag="docker"):
    """--image, repeated: the patterns tried in order."""

    image_patterns: tuple[str, ...] = DEFAULT_IMAGES

    def provider(self, cache: BuildCache, log_dir: Path) -> Provider:
        return DockerProvider(cache, patterns=self.image_patterns)


class DockerProvider(Provider, name="docker"):
    def __init__(
        self,
        cache: BuildCache,
        *,
        patterns: tuple[str, ...] = DEFAULT_IMAGES,
        arch: str | None = None,
        docker: str = "docker",
    ) -> None:
        self.cache = cache
        self.patterns = patterns
        self.arch = arch or platform.machine()
        self.docker = docker

    def _ok(self, argv: list[str], log_path: Path) -> bool:
        try:
            return run_logged(argv, log_path) == 0
        except OSError as exc:
            with log_path.open("ab") as log:
                log.write(f"{exc}\n".encode())
            return False

    def _size(self, image: str) -> int:
        result = subprocess.run(
            [self.docker, "image", "inspect", "--format", "{{.Size}}", image],
            capture_output=True,
            text=True,
            check=False,
        )
        return int(result.stdout.strip()) if result.stdout.strip().isdigit() else 0

    def find(self, build: Build) -> Found:
        """`docker manifest inspect` asks the registry for the manifest only; layer sizes give the pull."""
        for image in image_candidates(self.patterns, build, self.arch):
            # Its output through a file, not a pipe: run_stoppable polls, and a multi-platform
            # manifest is more than a pipe holds unread.
            with tempfile.TemporaryFile() as out:
                try:
                    code = run_stoppable(
                        [self.docker, "manifest", "inspect", "-v", image], out, subprocess.DEVNULL
                    )
                except OSError as exc:
                    return Found(None, f"cannot run {self.docker} ({exc})")
                out.seek(0)
                manifest = out.read().decode(errors="replace")
            if code == 0:
                return Found(True, image, _layer_bytes(manifest))
        return Found(False, f"no manifest for {', '.join(image_candidates(self.patterns, build, self.arch))}")

    def prepare(self, build: Build) -> Prepared:
        key = f"{build.ref}-{self.arch}"
        data = self.cache.lookup(self.name, key)
        if data is not None:
            return Prepared(build, None, data)
        with self.cache.pinned(self.name, key):
            root = self.cache.fresh(self.name, key)
            log_path = root / PULL_LOG
            for image in image_candidates(self.patterns, build, self.arch):
                local = self._ok([self.docker, "image", "inspect", image], log_path)
                if local or self._ok([self.docker, "pull", image], log_path):
                    data = self.cache.complete(
                        self.name,
                        key,
                        {"image": image, "docker": self.docker, "external_bytes": self._size(image)},
                    )
                    self.cache.evict()
                    return Prepared(build, None, data)
        tried = ", ".join(image_candidates(self.patterns, build, self.arch))
        raise BuildUnavailable(f"no image for {build.label} could be pulled ({tried}); see {log_path}")

    def launch_spec(self, prepared: Prepared, base: LaunchSpec) -> LaunchSpec:
        return dataclasses.replace(base, kind=LaunchKind.DOCKER, image=prepared.info["image"])
