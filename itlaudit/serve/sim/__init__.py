"""A vLLM-compatible simulator server: the demo target and the fault-injection target.

The auditor's claims (token-true ITL under speculative decoding, truncation findings) are only as good
as its parsing of real vLLM streams, so the simulator speaks vLLM 0.32's wire format field for field:
the same key names and key order (vLLM serialises pydantic models with ``exclude_unset``, so explicitly
passed ``None`` values appear as ``null`` and unset ones are absent), one SSE chunk per engine step, the
chat role chunk, the trailing usage-only chunk, the mid-stream error frame and the HTTP error bodies.
The layouts (in `wire` and `endpoints`) were read from vLLM 0.32's ``entrypoints/openai`` and checked
against real captures in ``tests/fixtures/``.

It is not vLLM and says so: /version answers ``itlaudit-sim <version>``, its models are ``owned_by``
``itlaudit-sim`` and its system_fingerprint starts ``itlaudit-sim-``, so a run against it is labelled
simulated in meta.json, the ledger and the report.

Faults are injected server-side so that every finding the auditor can raise has a reproducible cause.

The package, by role: `config` (settings and the fault catalogue), `vocab` (tokens), `engine`
(generation and faults), `wire` (vLLM's chunk, usage and error layouts), `endpoints` (completions vs
chat), `validation` (request parsing), `metrics` (/metrics) and `server` (the aiohttp handlers).
"""

from typing import TYPE_CHECKING, Any

from itlaudit.serve.sim.config import SIM_VERSION, SimConfig

if TYPE_CHECKING:
    from itlaudit.serve.sim.server import make_app, run_sim, serve
    from itlaudit.serve.sim.wire import model_list

__all__ = ["SIM_VERSION", "SimConfig", "make_app", "model_list", "run_sim", "serve"]

_LAZY = {"make_app": "server", "run_sim": "server", "serve": "server", "model_list": "wire"}


def __getattr__(name: str) -> Any:
    """The server (aiohttp, prometheus_client, numpy) loads when first named: the CLI reads the
    config (`itlaudit sim --help`'s choices) at start-up and must not pay for it."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
