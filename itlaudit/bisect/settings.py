"""Everything a bisection was started with, stored in bisect.json so `--resume DIR` needs nothing else.

Three parts, each typed once: `ProbeSetup` (how a build is had and probed: the provider's own options
struct, where the build list comes from, the cache, the scenario and the server), which `track
nightly` shares whole; the verdict (`--regress` parsed once, into its Judge); and the trials' capture
options (CaptureOptions, whose access is the invocation's and never stored).

Also where the settings turn into things: the build list and the provider, so the CLI and resume
share one path from options to objects.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from itlaudit.analysis.convergence import DEFAULT_MAX_TRIALS
from itlaudit.bisect import build_range, github
from itlaudit.bisect.build_cache import BuildCache, parse_size
from itlaudit.bisect.build_range import Build
from itlaudit.bisect.providers import PROVIDERS, Provider, ProviderOptions
from itlaudit.bisect.providers.docker import release_image
from itlaudit.bisect.providers.pip import PipOptions
from itlaudit.bisect.providers.wheels import WheelsOptions
from itlaudit.bisect.verdict import AutoJudge, Judge, ScriptJudge, parse_regress
from itlaudit.capture.runner import CaptureOptions
from itlaudit.errors import BisectError
from itlaudit.model.jsonvalue import JSONObject, JSONValue
from itlaudit.serve.testbed import default_cache_dir

# The seed case as a packaged scenario: what a bare `itlaudit bisect --from A --to B` runs.
DEFAULT_SCENARIO = Path(__file__).resolve().parent.parent / "data" / "bisect-seed.toml"
# What bisect.json keeps of the capture options: the rest is the invocation's (headers, API key).
_STORED_CAPTURE = ("workers", "stamp")


class ProbeSetup(msgspec.Struct, kw_only=True, frozen=True):
    """How a build is had and probed: the provider (its own options), where the build list comes
    from, the build cache, the scenario with its chosen variants and the server's model and
    arguments. `bisect` and `track nightly` take it from one option group (cli/probe_setup.py); a
    nightly's source of builds in the history is this, so `track bisect` probes as the nightly did."""

    provider: ProviderOptions = msgspec.field(default_factory=WheelsOptions)
    repo: str | None = None
    commits_file: str | None = None
    github_repo: str = "vllm-project/vllm"
    github_api: str = github.DEFAULT_API
    cache_dir: str = ""
    cache_size: str = "40G"
    scenario: str = str(DEFAULT_SCENARIO)
    variants: tuple[str, ...] = ()  # empty: every variant of the scenario
    model: str | None = None
    server_args: tuple[str, ...] = ()
    ready_timeout_s: float | None = None

    def __post_init__(self) -> None:
        if self.repo and self.commits_file:
            raise BisectError("give --repo or --commits-file, not both")

    @property
    def by_version(self) -> bool:
        return self.provider.by_version

    def to_json(self) -> JSONObject:
        encoded: JSONObject = msgspec.to_builtins(self)
        return encoded

    @classmethod
    def from_json(cls, data: JSONValue) -> ProbeSetup:
        """This struct's JSON, or the flat settings of an older itlaudit (see `_upgrade`)."""
        if isinstance(data, dict) and isinstance(data.get("provider"), str):
            data = _upgrade(data)["setup"]
        try:
            return msgspec.convert(data, cls)
        except msgspec.ValidationError as exc:
            raise BisectError(f"settings {exc}") from None


@dataclass
class Settings:
    good: str
    bad: str
    setup: ProbeSetup = field(default_factory=ProbeSetup)
    regress: Judge = field(default_factory=AutoJudge)  # --regress and --script, parsed once
    find_fix: bool = False
    threshold: float = 1.5
    alpha: float = 0.05
    trials: int | None = None
    max_trials: int = DEFAULT_MAX_TRIALS  # run's and sweep's too: one default
    prefetch: bool | None = None
    parallel: int = 1  # builds probed per round, each on its own GPU
    cluster: str | None = None  # None: probes on this host; "auto" or "ray://HOST:PORT": Ray tasks
    # How each trial captures (--workers, --stamp); its headers and API key are the invocation's
    # (given again to --resume) and never stored.
    capture: CaptureOptions = field(default_factory=CaptureOptions)

    def __post_init__(self) -> None:
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

    @property
    def effective_trials(self) -> int:
        """Timing (auto included) needs repeats to be tested; a finding is a finding on the first pass."""
        if self.trials is not None:
            return self.trials
        return 3 if self.regress.timing else 1

    @property
    def effective_prefetch(self) -> bool:
        """Installing the next builds competes for CPU with the server under test, which only
        matters when the verdict is a timing."""
        return self.prefetch if self.prefetch is not None else not self.regress.timing

    def to_json(self) -> JSONObject:
        """bisect.json's `settings` (format 4): the fields by name, the setup and the provider's
        options nested, the judge as the user spelled it (`regress`, and `script` for --script), the
        capture options without their access."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["regress"] = self.regress.text
        data["script"] = self.regress.script if isinstance(self.regress, ScriptJudge) else None
        data["capture"] = {key: getattr(self.capture, key) for key in _STORED_CAPTURE}
        encoded: JSONObject = msgspec.to_builtins(data)
        return encoded

    @classmethod
    def from_json(cls, data: JSONValue) -> Settings:
        """bisect.json's settings, type-checked field by field (a key this itlaudit does not know is
        ignored; an older file's flat settings are read through `_upgrade`); __post_init__ checks
        them as it checks the command line's."""
        if not isinstance(data, dict):
            raise BisectError(f"settings: a {type(data).__name__}, not an object")
        if "setup" not in data:
            data = _upgrade(data)
        types = typing.get_type_hints(cls)
        values: dict[str, typing.Any] = {}
        try:
            for name in types.keys() - {"regress", "capture"}:
                if name in data:
                    values[name] = msgspec.convert(data[name], types[name])
            stored = msgspec.convert(data.get("capture", {}), dict[str, typing.Any])
            capture = {key: stored[key] for key in _STORED_CAPTURE if key in stored}
            values["capture"] = msgspec.convert(capture, CaptureOptions)
            rule, script = data.get("regress", "auto"), data.get("script")
            values["regress"] = parse_regress(msgspec.convert(rule, str), msgspec.convert(script, str | None))
        except msgspec.ValidationError as exc:
            raise BisectError(f"settings {exc}") from None
        return cls(**values)

    def with_access(self, capture: CaptureOptions) -> Settings:
        """These settings with the invocation's access (headers, API key: never stored) on their
        capture options: what `--resume` runs with."""
        return dataclasses.replace(self, capture=dataclasses.replace(self.capture, access=capture.access))


def _upgrade(flat: dict[str, JSONValue]) -> dict[str, JSONValue]:
    """bisect.json's settings before format 4 (and a history's nightly source recorded then) in
    format 4's shape: they were one flat object, every provider's options side by side (each
    provider's struct takes its own by name) and the capture's `workers` a string ("auto" or "N")."""
    kind = str(flat.get("provider"))
    options = PROVIDERS.get(kind)
    provider = {"kind": kind, **{k: flat[k] for k in options.__struct_fields__ if k in flat}}
    setup = {k: flat[k] for k in ProbeSetup.__struct_fields__ if k in flat}
    workers = flat.get("workers", "auto")
    capture = {
        "workers": None if workers == "auto" else int(str(workers)) if str(workers).isdigit() else workers,
        "stamp": flat.get("stamp", CaptureOptions.stamp),
    }
    return {**flat, "setup": {**setup, "provider": provider}, "capture": capture}


def commit_source(setup: ProbeSetup) -> tuple[str, str]:
    """Where the build list comes from, as (kind, words): --repo, else the current directory when it
    is a vLLM clone, else GitHub's compare API (so the bare command works on a GPU box with nothing
    but network)."""
    if isinstance(setup.provider, PipOptions):
        return "index", f"package index {setup.provider.index_url} ({setup.provider.package})"
    if setup.commits_file:
        return "file", f"commits file {setup.commits_file}"
    if setup.repo:
        return "repo", f"git clone {setup.repo}"
    if build_range.is_vllm_clone(Path.cwd()):
        return "cwd", f"git clone {Path.cwd()}"
    return "github", f"GitHub compare API {setup.github_api} ({setup.github_repo})"


def list_builds(settings: Settings) -> list[Build]:
    """Oldest first, whatever the source: versions for the pip provider, commits otherwise."""
    setup = settings.setup
    kind, _ = commit_source(setup)
    if isinstance(setup.provider, PipOptions):
        pip = setup.provider
        available = build_range.fetch_versions(pip.package, pip.index_url)
        builds = build_range.versions_between(available, settings.good, settings.bad, pre=pip.pre)
    elif kind == "file":
        builds = build_range.commits_from_file(Path(str(setup.commits_file)), settings.good, settings.bad)
    elif kind in ("repo", "cwd"):
        builds = build_range.commits_from_repo(Path(setup.repo or "."), settings.good, settings.bad)
    else:
        builds = github.commits_from_github(
            setup.github_api, setup.github_repo, settings.good, settings.bad, default_cache_dir()
        )
    if len(builds) < 2:
        raise BisectError(f"the range {settings.good}..{settings.bad} holds fewer than two builds")
    return builds


def make_provider(setup: ProbeSetup, log_dir: Path) -> tuple[Provider, BuildCache]:
    try:
        limit = parse_size(setup.cache_size)
    except ValueError as exc:
        raise BisectError(f"--cache-size: {exc}") from None
    cache = BuildCache(Path(setup.cache_dir), limit, {"docker": release_image})
    return setup.provider.provider(cache, log_dir), cache
