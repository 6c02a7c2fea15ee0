"""How itlaudit reaches a server: the headers every request carries (the API key's Authorization among
them) and how https is verified. One object, used by the streaming POSTs and by every small request
around them (/v1/models, /metrics, /version, launcher readiness, /tokenize), so a gated server is
reached the same way everywhere.

Held in memory only: no record, meta.json, ledger line or report gets a value from here, and
`secret_values` lists the values the writers must mask if a server echoes one back.
"""

from __future__ import annotations

import functools
import re
import ssl
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from itlaudit.model.redact import header_secret_values

__all__ = ["API_KEY_ENV", "HEADER_NAME", "NO_ACCESS", "Access", "api_key_header", "valid_header"]

if TYPE_CHECKING:
    import aiohttp

API_KEY_ENV = ("OPENAI_API_KEY", "VLLM_API_KEY")
HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an RFC 9110 token


def valid_header(name: str, value: object) -> bool:
    """A header h11 will send as given: a token name and a one-line string value."""
    return bool(HEADER_NAME.match(name)) and isinstance(value, str) and not any(c in value for c in "\r\n")


@dataclass(frozen=True)
class Access:
    headers: tuple[tuple[str, str], ...] = ()
    insecure: bool = False  # https without certificate or host name checks (--insecure)
    ca_cert: str | None = None  # a PEM bundle to verify the server's certificate with (--ca-cert)

    def header_map(self) -> dict[str, str]:
        return dict(self.headers)

    def with_headers(self, extra: Mapping[str, str]) -> Access:
        """A variant's own `headers`, over the command line's (a name given twice: the variant's wins)."""
        merged = {name.lower(): (name, value) for name, value in self.headers}
        merged.update({name.lower(): (name, value) for name, value in extra.items()})
        return Access(tuple(merged.values()), self.insecure, self.ca_cert)

    def secret_values(self) -> set[str]:
        """Values to mask wherever text from a server lands in a file or on the terminal."""
        return header_secret_values(self.headers)

    def ssl_context(self) -> ssl.SSLContext | None:
        """None is the default (verified against the system's CAs)."""
        if not self.insecure and self.ca_cert is None:
            return None
        return _ssl_context(self.insecure, self.ca_cert)

    def session(self) -> aiohttp.ClientSession:
        """An aiohttp session that sends the same headers and verifies https the same way."""
        import aiohttp

        context = self.ssl_context()
        connector = aiohttp.TCPConnector(ssl=context) if context is not None else None
        return aiohttp.ClientSession(headers=self.header_map(), connector=connector)

    def urlopen(self, url: str, timeout_s: float) -> urllib.request._UrlopenRet:
        """urllib's GET with the same headers and TLS (the synchronous probes: /metrics, /version,
        readiness)."""
        request = urllib.request.Request(url, headers=self.header_map())
        return urllib.request.urlopen(request, timeout=timeout_s, context=self.ssl_context())


@functools.cache
def _ssl_context(insecure: bool, ca_cert: str | None) -> ssl.SSLContext:
    """Built once per setting: loading a CA bundle costs milliseconds, too much per request."""
    context = ssl.create_default_context(cafile=ca_cert)
    if insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


NO_ACCESS = Access()


def api_key_header(api_key: str | None, environ: Mapping[str, str]) -> tuple[str, str] | None:
    """--api-key, else OPENAI_API_KEY, else VLLM_API_KEY (the order vllm bench serve and the OpenAI
    client read them in), as `Authorization: Bearer`."""
    key = api_key or next((environ[name] for name in API_KEY_ENV if environ.get(name)), None)
    return ("Authorization", f"Bearer {key}") if key else None
