"""Build providers: each turns one commit or version into a server the launcher can start.

Providers only find, fetch and install; starting and stopping the server stays the launcher's job,
so every provider inherits its guaranteed process-group teardown. `prepare` is the slow, cacheable
part (a download, a pip install) and may run in the background for the next candidates; it raises
BuildUnavailable for anything that means "this build cannot be had", which the search treats as skip.
"""

from __future__ import annotations

from itlaudit.bisect.providers import command, docker, pip, wheels
from itlaudit.bisect.providers.base import PROVIDERS, Found, Prepared, Provider

__all__ = ["PROVIDERS", "Found", "Prepared", "Provider", "command", "docker", "pip", "wheels"]
