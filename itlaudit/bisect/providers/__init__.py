"""Build providers: each turns one commit or version into a server the launcher can start.

Providers only find, fetch and install; starting and stopping the server stays the launcher's job,
so every provider inherits its guaranteed process-group teardown. `prepare` is the slow, cacheable
part (a download, a pip install) and may run in the background for the next candidates; it raises
BuildUnavailable for anything that means "this build cannot be had", which the search treats as skip.

Each provider has its own options struct; `ProviderOptions` is their tagged union (what bisect.json
decodes), and PROVIDERS names each struct by its `--provider` name. A new provider adds its struct
to the union here.
"""

from __future__ import annotations

from typing import TypeAlias, get_args

from itlaudit.bisect.providers import base, command, docker, pip, wheels
from itlaudit.bisect.providers.base import Found, Prepared, Provider
from itlaudit.errors import BisectError
from itlaudit.model.registry import Registry

__all__ = [
    "PROVIDERS",
    "Found",
    "Prepared",
    "Provider",
    "ProviderOptions",
    "base",
    "command",
    "docker",
    "pip",
    "wheels",
]

ProviderOptions: TypeAlias = (
    command.CommandOptions | docker.DockerOptions | pip.PipOptions | wheels.WheelsOptions
)

PROVIDERS: Registry[type[base.ProviderOptions]] = Registry("--provider", BisectError)
for _options in get_args(ProviderOptions):
    PROVIDERS.register(_options.__struct_config__.tag)(_options)
