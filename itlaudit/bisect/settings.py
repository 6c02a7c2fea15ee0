"""Everything a bisection was started with, stored in bisect.json so `--resume DIR` needs nothing else.

Also where the settings turn into things: the build list and the provider, so the CLI and resume
share one path from options to objects.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import msgspec

from itlaudit.analysis.convergence import DEFAULT_MAX_TRIALS
from itlaudit.bisect import build_range, github
from itlaudit.bisect.build_cache import BuildCache, parse_size
from itlaudit.bisect.build_range import Build
from itlaudit.bisect.providers import PROVIDERS, Provider
from itlaudit.bisect.providers.docker import DEFAULT_IMAGES, release_image
from itlaudit.bisect.providers.wheels import DEFAULT_URL, DEFAULT_VARIANTS
from itlaudit.bisect.verdict import Judge, parse_regress
from itlaudit.errors import BisectError
from itlaudit.model.access import NO_ACCESS, Access
from itlaudit.model.jsonvalue import JSONObject, JSONValue
from itlaudit.model.vocabulary import StampMode
from itlaudit.serve.testbed import default_cache_dir

if TYPE_CHECKING:
    from itlaudit.capture.runner import CaptureOptions

__all__ = ["DEFAULTS", "DEFAULT_SCENARIO", "Settings", "commit_source", "list_builds", "make_provider"]

# The seed case as a packaged scenario: what a bare `itlaudit bisect --from A --to B` runs.
DEFAULT_SCENARIO = Path(__file__).resolve().parent.parent / "data" / "bisect-seed.toml"


@dataclass
class Settings:
    good: str
    bad: str
    scenario: str = str(DEFAULT_SCENARIO)
    provider: str = "wheels"
    repo: str | None = None
    commits_file: str | None = None
    find_fix: bool = False
    regress: str = "auto"
    script: str | None = None
    threshold: float = 1.5
    alpha: float = 0.05
    trials: int | None = None
    max_trials: int = DEFAULT_MAX_TRIALS  # run's and sweep's too: one default
    variants: list[str] = field(default_factory=list)  # empty: every variant of the scenario
    model: str | None = None
    server_args: list[str] = field(default_factory=list)
    ready_timeout_s: float | None = None
    cache_dir: str = ""
    cache_size: str = "40G"
    prefetch: bool | None = None
    wheels_url: str = DEFAULT_URL
    wheel_variants: list[str] = field(default_factory=lambda: list(DEFAULT_VARIANTS))
    image_patterns: list[str] = field(default_factory=lambda: list(DEFAULT_IMAGES))
    package: str = "vllm"
    index_url: str = build_range.PYPI_SIMPLE
    pre: bool = False
    pip_args: list[str] = field(default_factory=list)
    post_install: list[str] | None = None
    server_cmd: str | None = None
    build_cmd: str | None = None
    github_repo: str = "vllm-project/vllm"
    github_api: str = github.DEFAULT_API
    parallel: int = 1  # builds probed per round, each on its own GPU
    cluster: str | None = None  # None: probes on this host; "auto" or "ray://HOST:PORT": Ray tasks
    # How each trial captures (--workers, --stamp); its headers and API key are given to each
    # invocation, --resume included, and never stored here.
    workers: str = "auto"
    stamp: str = StampMode.KERNEL

    def __post_init__(self) -> None:
        PROVIDERS.get(self.provider).check(self)  # an unknown name fails here, naming the known ones
        if self.repo and self.commits_file:
            raise BisectError("give --repo or --commits-file, not both")
        if self.threshold <= 1.0:
            raise BisectError(f"--threshold {self.threshold}: must be above 1 (a ratio, e.g. 1.5)")
        if self.trials is not None and self.trials < 1:
            raise BisectError("--trials must be at least 1")
        if self.max_trials < self.effective_trials:
            raise BisectError(f"--max-trials {self.max_trials} is below --trials {self.effective_trials}")
        if self.parallel < 1:
            raise BisectError(
                f"--parallel {self.parallel}: give the number of builds to probe at once (1 or more)"
            )
        parse_regress(self.regress, self.script)  # fail before any build is touched

    @property
    def regress_rule(self) -> Judge:
        return parse_regress(self.regress, self.script)

    @property
    def effective_trials(self) -> int:
        """Timing (auto included) needs repeats to be tested; a finding is a finding on the first pass."""
        if self.trials is not None:
            return self.trials
        return 3 if parse_regress(self.regress, self.script).timing else 1

    @property
    def effective_prefetch(self) -> bool:
        """Installing the next builds competes for CPU with the server under test, which only
        matters when the verdict is a timing."""
        return self.prefetch if self.prefetch is not None else not self.regress_rule.timing

    @property
    def by_version(self) -> bool:
        return PROVIDERS.get(self.provider).by_version

    def capture(self, access: Access = NO_ACCESS) -> CaptureOptions:
        """The trials' capture options: these settings' workers and stamp, the invocation's access."""
        from itlaudit.capture.runner import CaptureOptions  # the capture stack stays off --help's path

        return CaptureOptions.from_flags(self.workers, self.stamp, access=access)

    def to_json(self) -> JSONObject:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: JSONValue) -> Settings:
        """bisect.json's settings, type-checked field by field (a key this itlaudit does not know is
        ignored); __post_init__ checks them as it checks the command line's."""
        try:
            return msgspec.convert(data, cls)
        except msgspec.ValidationError as exc:
            raise BisectError(f"settings {exc}") from None


def _default(found: dataclasses.Field[Any]) -> Any:
    if found.default_factory is not dataclasses.MISSING:
        return found.default_factory()
    return found.default


# Each setting's default as Settings states it: the command line shows and uses these, no copies.
DEFAULTS: Mapping[str, Any] = MappingProxyType(
    {f.name: _default(f) for f in dataclasses.fields(Settings) if f.name not in ("good", "bad")}
)


def commit_source(settings: Settings) -> tuple[str, str]:
    """Where the build list comes from, as (kind, words): --repo, else the current directory when it
    is a vLLM clone, else GitHub's compare API (so the bare command works on a GPU box with nothing
    but network)."""
    if settings.by_version:
        return "index", f"package index {settings.index_url} ({settings.package})"
    if settings.commits_file:
        return "file", f"commits file {settings.commits_file}"
    if settings.repo:
        return "repo", f"git clone {settings.repo}"
    if build_range.is_vllm_clone(Path.cwd()):
        return "cwd", f"git clone {Path.cwd()}"
    return "github", f"GitHub compare API {settings.github_api} ({settings.github_repo})"


def list_builds(settings: Settings) -> list[Build]:
    """Oldest first, whatever the source: versions for the pip provider, commits otherwise."""
    kind, _ = commit_source(settings)
    if kind == "index":
        available = build_range.fetch_versions(settings.package, settings.index_url)
        builds = build_range.versions_between(available, settings.good, settings.bad, pre=settings.pre)
    elif kind == "file":
        builds = build_range.commits_from_file(Path(str(settings.commits_file)), settings.good, settings.bad)
    elif kind in ("repo", "cwd"):
        builds = build_range.commits_from_repo(Path(settings.repo or "."), settings.good, settings.bad)
    else:
        builds = github.commits_from_github(
            settings.github_api, settings.github_repo, settings.good, settings.bad, default_cache_dir()
        )
    if len(builds) < 2:
        raise BisectError(f"the range {settings.good}..{settings.bad} holds fewer than two builds")
    return builds


def make_provider(settings: Settings, bisect_dir: Path) -> tuple[Provider, BuildCache]:
    try:
        limit = parse_size(settings.cache_size)
    except ValueError as exc:
        raise BisectError(f"--cache-size: {exc}") from None
    cache = BuildCache(Path(settings.cache_dir), limit, {"docker": release_image})
    return PROVIDERS.get(settings.provider).from_settings(settings, cache, bisect_dir), cache
