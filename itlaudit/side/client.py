"""Every request itlaudit makes outside the measured streams, through one client: a server's identity
(/v1/models, /version, the non-streaming completions of scoring), /metrics, /tokenize, the prefix-cache
reset, launcher readiness, and the bisect metadata (GitHub, a wheel index, a package index).

The streams go through the h11 transport (capture/transport.py), which stamps each chunk on arrival;
these requests are off the measurement path, so one aiohttp session serves them all, with one timeout
setting (`SIDE_TIMEOUT_S`, a call may ask for less or more) and one error mapping, done here at the
boundary as httpx does: whatever aiohttp or the OS raises leaves this module as one of

    ServerUnreachableError   refused, no such host, TLS that does not verify (the advice says which)
    └── ServerTimeout        no complete answer within the timeout
    ServerRejectedError
    ├── ServerStatusError    an answer that is not 2xx (`status`, `headers`, `body` kept for the caller)
    └── ServerAnswerError    a 2xx answer whose body is not the JSON object asked for

each with a one-line message that names the URL (credentials in it masked) and what to do.

`SideClient` is the async context manager (one session, its headers and TLS from an `Access`);
`BlockingSideClient` is its façade for synchronous callers (readiness, bisect metadata, the /metrics
window between variants), one short-lived session per call. aiohttp is imported when a session
opens, not with this module: the hot path imports the two message helpers below, and nothing of
aiohttp may come with them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

import msgspec

from itlaudit.errors import (
    AnswerTooLarge,
    ServerAnswerError,
    ServerStatusError,
    ServerTimeout,
    ServerUnreachableError,
)
from itlaudit.model.access import NO_ACCESS, TLS_ADVICE, Access
from itlaudit.model.jsonvalue import JSONMapping, JSONObject, JSONValue
from itlaudit.model.redact import redact_url
from itlaudit.model.run_context import SGLANG_VERSION_PREFIX

if TYPE_CHECKING:
    import aiohttp

# The one timeout of a side request: long enough for a busy server's /v1/models or a GitHub page.
SIDE_TIMEOUT_S = 30.0
# A readiness probe is asked again every fraction of a second, so one that hangs must give up soon.
READY_PROBE_TIMEOUT_S = 2.0
_ERROR_BODY_CHARS = 300
_SHOWN_BODY_BYTES = 100
_REACH_ADVICE = "check that the server is running and that the URL is right"
# Where SGLang says its build, newest first (python/sglang/srt/entrypoints/http_server.py).
_SGLANG_INFO_PATHS = ("/server_info", "/get_server_info")

T = TypeVar("T")


def server_error_message(body: bytes, http_status: int) -> str:
    """vLLM's own explanation from an error body, across the shapes its versions have used:
    `{"error": {"message": ...}}` (recent), `{"message": ...}` / `{"object": "error", "message": ...}`
    (older), FastAPI's `{"detail": ...}` (unknown routes); otherwise the start of the raw body."""
    text = body.decode("utf-8", "replace")
    try:
        obj = json.loads(text)
    except ValueError:
        obj = None
    if isinstance(obj, dict):
        error = obj.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return _one_line(error["message"])
        for key in ("message", "detail", "error"):
            if isinstance(obj.get(key), str):
                return _one_line(obj[key])
    text = _one_line(text)
    return text[:_ERROR_BODY_CHARS] if text else f"HTTP {http_status} with an empty body"


def describe_connection_failure(exc: BaseException, timeout_s: float | None = None) -> str:
    """One line for a record or a message: aiohttp's messages can span lines and a bare
    TimeoutError has none."""
    if isinstance(exc, TimeoutError) and not str(exc):
        within = f" within {timeout_s:g} s" if timeout_s is not None else ""
        return f"TimeoutError: no complete response{within}"
    detail = _one_line(str(exc))
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__


def _one_line(text: str) -> str:
    return " ".join(text.split())


@dataclass(frozen=True)
class SideAnswer:
    """A complete answer, read to its end: status, headers (names in lower case) and body."""

    method: str
    url: str
    status: int
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def where(self) -> str:
        """`GET http://host/path` with any credentials in the URL masked, for messages."""
        return f"{self.method} {redact_url(self.url)}"

    def checked(self) -> SideAnswer:
        """This answer if it is 2xx; otherwise ServerStatusError quoting the server's explanation."""
        if self.ok:
            return self
        raise ServerStatusError(
            f"{self.where()} answered HTTP {self.status}: {server_error_message(self.body, self.status)}",
            status=self.status,
            headers=self.headers,
            body=self.body,
        )

    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> JSONValue:
        """The body as JSON, whatever its shape; ServerAnswerError when it is not JSON."""
        try:
            value: JSONValue = json.loads(self.body)
            return value
        except ValueError:
            raise ServerAnswerError(
                f"{self.where()} answered with a body that is not JSON (got "
                f"{self.body[:_SHOWN_BODY_BYTES]!r}); is this the server you meant?"
            ) from None

    def json_object(self) -> JSONObject:
        """The body as a JSON object (what every OpenAI-style endpoint answers), not yet checked further."""
        obj = self.json()
        if not isinstance(obj, dict):
            raise ServerAnswerError(
                f"{self.where()} did not answer with a JSON object (got "
                f"{self.body[:_SHOWN_BODY_BYTES]!r}); is this a vLLM server?"
            )
        return obj


class TokenizeAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """vLLM's /tokenize answer, the part itlaudit reads: how many tokens the prompt is. Its `tokens`
    and `max_model_len` are left unread, so a server that sends only the count is answer enough."""

    count: int


class SideClient:
    """One aiohttp session for every side request of a pass, sending `access`'s headers and
    verifying https its way. Use as `async with SideClient(access) as client:`; every method takes
    the server's base URL (or a full URL), so one session serves several servers."""

    def __init__(self, access: Access = NO_ACCESS, *, timeout_s: float = SIDE_TIMEOUT_S) -> None:
        self.access = access
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> SideClient:
        import aiohttp

        context = self.access.ssl_context()
        connector = aiohttp.TCPConnector(ssl=context) if context is not None else None
        self._session = aiohttp.ClientSession(headers=self.access.header_map(), connector=connector)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def request(
        self,
        method: str,
        url: str,
        *,
        body: JSONMapping | None = None,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        max_bytes: int | None = None,
    ) -> SideAnswer:
        """One request read to its end. `body`, when given, is sent as JSON. Whatever the status,
        the answer comes back; only no answer at all raises (ServerUnreachableError, ServerTimeout),
        or, with `max_bytes`, a body longer than that (AnswerTooLarge: read no further than the limit)."""
        import aiohttp

        if self._session is None:
            raise RuntimeError("SideClient used outside `async with`")
        limit = self.timeout_s if timeout_s is None else timeout_s
        data = None if body is None else json.dumps(body).encode()
        sent = dict(headers or {})
        if data is not None:
            sent.setdefault("Content-Type", "application/json")
        try:
            async with self._session.request(
                method, url, data=data, headers=sent, timeout=aiohttp.ClientTimeout(total=limit)
            ) as resp:
                raw = await resp.read() if max_bytes is None else await _read_at_most(resp, max_bytes)
                answer_headers = {name.lower(): value for name, value in resp.headers.items()}
                status = resp.status
        except TimeoutError:
            error: ServerUnreachableError = ServerTimeout(
                f"{method} {redact_url(url)}: no complete answer within {limit:g} s; the server may be "
                "overloaded or stalled (a busy server: try again; a hung one: restart it)"
            )
            error.reason = f"no complete answer within {limit:g} s"
            raise error from None
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            reason = describe_connection_failure(exc)
            error = ServerUnreachableError(f"cannot reach {redact_url(url)} ({reason}); {_advice(exc)}")
            error.reason = reason
            raise error from None
        return SideAnswer(method, url, status, answer_headers, raw)

    async def get_json(self, url: str, *, timeout_s: float | None = None) -> JSONObject:
        """GET a JSON object; any other answer raises, since a caller asking for one cannot go on."""
        return (await self.request("GET", url, timeout_s=timeout_s)).checked().json_object()

    async def post_json(self, url: str, body: JSONMapping, *, timeout_s: float | None = None) -> JSONObject:
        """POST a JSON body and read a JSON object back (completions, /tokenize, /detokenize)."""
        return (await self.request("POST", url, body=dict(body), timeout_s=timeout_s)).checked().json_object()

    async def models(self, base_url: str) -> dict[str, int | None]:
        """Served model names, each with its context length where the server states it (vLLM's
        `max_model_len` in /v1/models), so a prompt that cannot fit is refused before it is built."""
        url = _join(base_url, "/v1/models")
        entries = (await self.get_json(url)).get("data")
        cards = [e for e in entries if isinstance(e, dict) and "id" in e] if isinstance(entries, list) else []
        if not isinstance(entries, list) or len(cards) != len(entries):
            raise ServerAnswerError(
                f"GET {redact_url(url)} did not list models as {{'data': [{{'id': ...}}]}}; "
                "is this a vLLM server?"
            )
        served: dict[str, int | None] = {}
        for card in cards:
            length = card.get("max_model_len")
            if isinstance(length, bool) or not isinstance(length, int) or length < 1:
                length = None
            served[str(card["id"])] = length
        return served

    async def version(self, base_url: str, *, timeout_s: float | None = None) -> str | None:
        """/version's `version` (vLLM's build); None when the object has none. A server without it
        that is SGLang says its build in /server_info (newer builds) or /get_server_info (older):
        their `version`, as "sglang 0.5.14" (model.run_context.SGLANG_VERSION_PREFIX). A server with
        none of them raises /version's ServerStatusError (404), which callers that treat it as unknown
        catch."""
        try:
            answer = await self.get_json(_join(base_url, "/version"), timeout_s=timeout_s)
        except ServerStatusError as exc:
            if exc.status != HTTPStatus.NOT_FOUND:
                raise
            for path in _SGLANG_INFO_PATHS:
                with contextlib.suppress(ServerStatusError):
                    info = await self.get_json(_join(base_url, path), timeout_s=timeout_s)
                    sglang = info.get("version")
                    if sglang is not None:
                        return f"{SGLANG_VERSION_PREFIX}{sglang}"
            raise
        version = answer.get("version")
        return str(version) if version is not None else None

    async def metrics_text(self, base_url: str, *, timeout_s: float | None = None) -> str:
        """/metrics as Prometheus text (parsed in analysis/, not here)."""
        answer = await self.request("GET", _join(base_url, "/metrics"), timeout_s=timeout_s)
        return answer.checked().text()

    async def tokenize(self, base_url: str, body: JSONMapping) -> TokenizeAnswer:
        """vLLM's /tokenize with `body` (`model` and `prompt` or `messages`); an answer without a
        token count is ServerAnswerError."""
        url = _join(base_url, "/tokenize")
        answer = await self.post_json(url, body)
        try:
            return msgspec.convert(answer, TokenizeAnswer)
        except msgspec.ValidationError as exc:
            raise ServerAnswerError(
                f"POST {redact_url(url)} did not answer with a token count ({exc}); is this a vLLM server?"
            ) from None

    async def reset_prefix_cache(self, base_url: str) -> SideAnswer:
        """POST vLLM's dev-mode /reset_prefix_cache; the answer comes back whatever its status, since
        a server without the endpoint is a note in meta.json, not a failed run."""
        return await self.request("POST", _join(base_url, "/reset_prefix_cache"))

    async def ready(self, base_url: str, *, timeout_s: float = READY_PROBE_TIMEOUT_S) -> bool:
        """/health says the engine is up and /v1/models that the router serves: both 2xx, or not
        ready. Never raises for a server that is not (yet) there."""
        for path in ("/health", "/v1/models"):
            try:
                answer = await self.request("GET", _join(base_url, path), timeout_s=timeout_s)
            except ServerUnreachableError:
                return False
            if not answer.ok:
                return False
        return True


class BlockingSideClient:
    """The same requests for synchronous callers: each call opens a session, makes its request and
    closes it, on an event loop of its own (so it must not be called from a coroutine)."""

    def __init__(self, access: Access = NO_ACCESS, *, timeout_s: float = SIDE_TIMEOUT_S) -> None:
        self.access = access
        self.timeout_s = timeout_s

    def _run(self, call: Callable[[SideClient], Awaitable[T]]) -> T:
        async def once() -> T:
            async with SideClient(self.access, timeout_s=self.timeout_s) as client:
                return await call(client)

        return asyncio.run(once())

    def request(
        self,
        method: str,
        url: str,
        *,
        body: JSONMapping | None = None,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        max_bytes: int | None = None,
    ) -> SideAnswer:
        return self._run(
            lambda client: client.request(
                method, url, body=body, headers=headers, timeout_s=timeout_s, max_bytes=max_bytes
            )
        )

    def get_json(self, url: str, *, timeout_s: float | None = None) -> JSONObject:
        return self._run(lambda client: client.get_json(url, timeout_s=timeout_s))

    def version(self, base_url: str, *, timeout_s: float | None = None) -> str | None:
        return self._run(lambda client: client.version(base_url, timeout_s=timeout_s))

    def metrics_text(self, base_url: str, *, timeout_s: float | None = None) -> str:
        return self._run(lambda client: client.metrics_text(base_url, timeout_s=timeout_s))

    def ready(self, base_url: str, *, timeout_s: float = READY_PROBE_TIMEOUT_S) -> bool:
        return self._run(lambda client: client.ready(base_url, timeout_s=timeout_s))


async def _read_at_most(resp: aiohttp.ClientResponse, max_bytes: int) -> bytes:
    """The body, refused (AnswerTooLarge) as soon as it passes `max_bytes`: a stated length is
    refused before any of it is read, an unstated one within one read past `max_bytes`."""
    where = f"{resp.method} {redact_url(str(resp.url))}"
    too_large = AnswerTooLarge(f"{where} answered with more than {max_bytes // 2**20} MiB; not read further")
    if resp.content_length is not None and resp.content_length > max_bytes:
        raise too_large
    pieces: list[bytes] = []
    size = 0
    async for piece in resp.content.iter_any():
        size += len(piece)
        if size > max_bytes:
            raise too_large
        pieces.append(piece)
    return b"".join(pieces)


def _join(base_url: str, path: str) -> str:
    return base_url.rstrip("/") + path


def _advice(exc: BaseException) -> str:
    """A certificate that does not verify is not a server that is down (fault row N16)."""
    import aiohttp

    if isinstance(exc, aiohttp.ClientConnectorCertificateError | aiohttp.ClientSSLError):
        return TLS_ADVICE
    return _REACH_ADVICE
