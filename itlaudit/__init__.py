"""itlaudit: a serving-benchmark auditor for vLLM.

Speculative decoding puts several tokens in one SSE chunk; itlaudit measures latency per token
from the server's own counts and says when an output was cut short.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any

__version__ = "0.1.0"


class Surface:
    """What a stage package offers the stages above it (its `__all__`): each name with the submodule
    it lives in (`homes`, e.g. {"summary": ("RunSummary",)}), and the submodules other stages import
    whole (`modules`). Another stage imports a name from its home submodule, never one left out;
    tests/test_layering.py checks every import against the surfaces.

    The package gets its `__all__`, `__getattr__` and `__dir__` from here (PEP 562), so `from
    itlaudit.analysis import RunSummary` works too, and importing a package loads none of its
    submodules: start-up pays only for what a command uses."""

    def __init__(self, package: str, homes: Mapping[str, Sequence[str]], modules: Sequence[str] = ()) -> None:
        self.package = package
        self.homes = {name: home for home, names in homes.items() for name in names}
        self.modules = tuple(modules)
        self.names = [*self.homes, *self.modules]

    def getattr(self, name: str) -> Any:
        """The package's `__getattr__`: a surface name, loaded from its home when first asked for."""
        if name in self.modules:
            return importlib.import_module(f"{self.package}.{name}")
        if name not in self.homes:
            raise AttributeError(f"module {self.package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{self.package}.{self.homes[name]}"), name)

    def dir(self) -> list[str]:
        """The package's `__dir__`: its surface."""
        return sorted(self.names)
