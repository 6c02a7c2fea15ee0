"""How to get a server for one variant: the one launch type, read by scenarios and smoke suites and
consumed by serve/launcher.py.

It lives in model/ because a scenario's [variants.launch] table parses into it and model/ may not import
the launcher (serve/ is a higher stage). serve/launcher.py's LAUNCHERS maps each LaunchKind to what it
does; a new kind is a member here and a function there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from itlaudit.errors import LaunchError

# How long a started server may take to answer /health and /v1/models: the one default for a
# scenario's, a smoke suite's and bisect's launches. A compiled vLLM engine on a large model (CUDA
# graphs, torch.compile) takes minutes; a server that is still silent after ten is not coming up.
READY_TIMEOUT_S = 600.0


class LaunchKind(StrEnum):
    """Start an interpreter with vLLM or SGLang, a docker image, any command; or attach to a given URL."""

    PYTHON = "python"  # an interpreter or venv with vLLM installed
    SGLANG = "sglang"  # an interpreter or venv with SGLang installed: `python -m sglang.launch_server`
    DOCKER = "docker"  # a vllm/vllm-openai style image
    COMMAND = "command"  # any argv, with {port} {model} {host} filled in
    # Attach to a server someone else started. Workflows use it for a URL they were given; a scenario or
    # a smoke suite says the same with the variant's own `url` key, so a [launch] table never names it.
    URL = "url"

    @property
    def needs(self) -> str:
        """The launch key this kind cannot start without."""
        if self is LaunchKind.DOCKER:
            return "image"
        return "python" if self is LaunchKind.SGLANG else self.value


@dataclass(frozen=True)
class LaunchSpec:
    """How to get a server. A scenario's [variants.launch] table sets the first nine fields; `url` is
    for LaunchKind.URL, and `gpus`, `docker_extra` and `host` are set by bisect's providers and tests."""

    kind: LaunchKind
    python: str | None = None
    image: str | None = None
    command: list[str] = field(default_factory=list)
    model: str | None = None
    served_model_name: str | None = None
    server_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    ready_timeout_s: float = READY_TIMEOUT_S
    url: str | None = None
    gpus: str = "all"
    docker_extra: list[str] = field(default_factory=list)
    host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        """A kind given as a plain string (a test, a provider) becomes its member; an unknown one is one
        line naming the known kinds."""
        if self.kind not in tuple(LaunchKind):
            raise LaunchError(f"launch kind {self.kind!r}: use one of {', '.join(LaunchKind)}")
        object.__setattr__(self, "kind", LaunchKind(self.kind))

    @property
    def dummy_weights(self) -> bool:
        """Whether the server loads random weights (vLLM's `--load-format dummy`): the way most vLLM
        performance work runs, and a model that writes gibberish by construction, which the quality
        rule must not read as a broken decode path (analysis.validity)."""
        args = [*self.command, *self.server_args]
        pairs = zip(args, [*args[1:], ""], strict=True)
        return any(a == "--load-format=dummy" or (a == "--load-format" and b == "dummy") for a, b in pairs)

    @property
    def speculative_config(self) -> dict[str, Any] | None:
        """The server's `--speculative-config` JSON as its arguments give it (vLLM's spelling, or
        the underscore one); None where it has none or it does not read as a JSON object."""
        args = [*self.command, *self.server_args]
        for at, arg in enumerate(args):
            name, eq, value = arg.partition("=")
            if name not in ("--speculative-config", "--speculative_config"):
                continue
            text = value if eq else (args[at + 1] if at + 1 < len(args) else "")
            try:
                config = json.loads(text)
            except ValueError:
                return None
            return config if isinstance(config, dict) else None
        return None


def launch_kind_problem(kind: str) -> str | None:
    """Why a [launch] table may not name `kind` (None: it may): the one message scenarios and smoke
    suites give."""
    if kind == LaunchKind.URL:
        return (
            f"is {kind!r}, which attaches to a running server: give the variant a `url` instead of a "
            "launch table"
        )
    started = [k for k in LaunchKind if k is not LaunchKind.URL]
    if kind not in started:
        return f"must be one of {', '.join(started)}, got {kind!r}"
    return None
