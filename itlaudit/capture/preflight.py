"""Talking to a server outside the streams: preflight GETs, and what a refusal or a failure says.

Every message is one line, since it ends up in a record's `error` or in the CLI's one-line failure.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from itlaudit.errors import ServerRejectedError, ServerUnreachableError, TransportError
from itlaudit.model.access import TLS_ADVICE

__all__ = [
    "CONNECTION_FAILURES",
    "describe_connection_failure",
    "fetch_json",
    "fetch_models",
    "served_models",
    "server_error_message",
]

_ERROR_BODY_CHARS = 300
# Everything that means "the network or the server went away", as opposed to a bug in this code.
CONNECTION_FAILURES = (aiohttp.ClientError, TransportError, TimeoutError, OSError)


def server_error_message(body: bytes, http_status: int) -> str:
    """vLLM's own explanation from an error body, across the shapes its versions have used:
    `{"error": {"message": ...}}` (recent), `{"message": ...}` / `{"object": "error", "message": ...}`
    (older), FastAPI's `{"detail": ...}` (unknown routes); otherwise the start of the raw body.
    """
    text = body.decode("utf-8", "replace")
    try:
        obj = json.loads(text)
    except ValueError:
        obj = None
    if isinstance(obj, dict):
        error = obj.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
        for key in ("message", "detail", "error"):
            if isinstance(obj.get(key), str):
                return obj[key]
    text = text.strip()
    return text[:_ERROR_BODY_CHARS] if text else f"HTTP {http_status} with an empty body"


def describe_connection_failure(exc: BaseException, timeout_s: float | None = None) -> str:
    """One line for the record: aiohttp messages can span lines and a bare TimeoutError has none."""
    if isinstance(exc, TimeoutError) and not str(exc):
        return f"TimeoutError: no complete response within {timeout_s:g} s"
    detail = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__


async def fetch_json(
    session: aiohttp.ClientSession, base_url: str, path: str, *, timeout_s: float = 30.0
) -> dict[str, Any]:
    """GET a small JSON document for preflight checks; unlike `stream_request` this raises, because
    a server that cannot answer a preflight makes the whole run pointless."""
    url = base_url.rstrip("/") + path
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            body = await resp.read()
            http_status = resp.status
    except CONNECTION_FAILURES as exc:
        # A certificate that does not verify is not a server that is down (fault row N16).
        advice = (
            TLS_ADVICE
            if isinstance(exc, aiohttp.ClientConnectorCertificateError)
            else "check that the server is running and that the URL is right"
        )
        raise ServerUnreachableError(
            f"cannot reach {url} ({describe_connection_failure(exc, timeout_s)}); {advice}"
        ) from None
    if not 200 <= http_status < 300:
        raise ServerRejectedError(
            f"{url} answered HTTP {http_status}: {server_error_message(body, http_status)}"
        )
    try:
        obj = json.loads(body)
    except ValueError:
        obj = None
    if not isinstance(obj, dict):
        raise ServerRejectedError(
            f"{url} did not answer with a JSON object (got {body[:100]!r}); is this a vLLM server?"
        )
    return obj


async def served_models(session: aiohttp.ClientSession, base_url: str) -> dict[str, int | None]:
    """Served model names, each with its context length where the server states it (vLLM's
    `max_model_len` in /v1/models), so a prompt that cannot fit is refused before it is built."""
    url_path = "/v1/models"
    listing = await fetch_json(session, base_url, url_path)
    entries = listing.get("data")
    if not isinstance(entries, list) or not all(isinstance(e, dict) and "id" in e for e in entries):
        raise ServerRejectedError(
            f"{base_url.rstrip('/')}{url_path} did not list models as {{'data': [{{'id': ...}}]}}; "
            "is this a vLLM server?"
        )
    served: dict[str, int | None] = {}
    for entry in entries:
        length = entry.get("max_model_len")
        valid = isinstance(length, int) and not isinstance(length, bool) and length > 0
        served[str(entry["id"])] = length if valid else None
    return served


async def fetch_models(session: aiohttp.ClientSession, base_url: str) -> list[str]:
    """Served model names, so a run can fail fast on a misspelt --model instead of 404ing per request."""
    return list(await served_models(session, base_url))
