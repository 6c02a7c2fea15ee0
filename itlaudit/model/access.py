"""How itlaudit reaches a server: the headers every request carries (the API key's Authorization among
them) and how https is verified. Data only: one object, read by the streaming transport
(capture/transport.py) and by the side-request client (side/client.py, /v1/models, /metrics,
/version, readiness, /tokenize), so a gated server is reached the same way everywhere; neither I/O
stack lives here.

Held in memory only: no record, meta.json, ledger line or report gets a value from here, and every
credential among its headers is remembered (redact.remember_secrets) as it is built, so a server that
echoes one back is masked in every file and terminal line.

What it sends is checked where it is given (header_problem, tls_problem): a header that would break
the request's framing, and TLS material that does not load, are one line before anything is sent or
any run folder is made (fault rows N16, N23).
"""

from __future__ import annotations

import functools
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from itlaudit.errors import ScenarioError
from itlaudit.model.redact import header_secret_values, redact_url, remember_secrets

API_KEY_ENV = ("OPENAI_API_KEY", "VLLM_API_KEY")
HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an RFC 9110 token


# Headers that say how the request is framed or routed on its connection: itlaudit writes them itself
# (Content-Length per body, one Host, keep-alive), and a second copy from a user desyncs the connection
# (the server reads the next request as this one's body) or smuggles a request through a proxy.
FRAMING_HEADERS = frozenset(
    {
        "content-length",
        "transfer-encoding",
        "host",
        "connection",
        "upgrade",
        "expect",
        "te",
        "keep-alive",
        "proxy-connection",
    }
)
# What a user does about a certificate that does not verify.
TLS_ADVICE = "trust its CA with --ca-cert, or pass --insecure"
# Control characters other than tab end a header line (CR, LF) or a C string (NUL) somewhere on the way.
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def header_problem(name: str, value: object) -> str | None:
    """Why a header cannot be sent as given, or None: the one check for --header, a variant's
    `headers` and the API key. The reason never quotes the value (it may be a credential)."""
    if not isinstance(value, str):
        return "its value must be a string"
    if _CONTROL.search(name) or _CONTROL.search(value):
        return "a control character (CR, LF, NUL, ...) in it would end the header line; give one line"
    if not HEADER_NAME.match(name):
        return "the name must be a token: letters, digits and !#$%&'*+-.^_`|~, no spaces or colons"
    if name.lower() in FRAMING_HEADERS:
        return f"{name} frames the HTTP request and itlaudit sets it itself; remove it"
    return None


def url_credentials_problem(url: str, access: Access) -> str | None:
    """Why `url` cannot be reached with `access`, or None: credentials in its userinfo
    (http://user:pw@host) and an Authorization header (--api-key, OPENAI_API_KEY, a header) are two
    answers to one question, and aiohttp refuses the pair with a traceback."""
    has_userinfo = "@" in urlsplit(url).netloc
    if has_userinfo and any(name.lower() == "authorization" for name, _ in access.headers):
        return (
            f"{redact_url(url)} carries credentials and an Authorization header is set too (--api-key, "
            "OPENAI_API_KEY, VLLM_API_KEY or a header); give the credentials one way"
        )
    return None


def tls_problem(ca_cert: str) -> str | None:
    """Why `ca_cert` cannot verify a server, or None: it is loaded now, once (the context is cached),
    so a bad file is one line at parse time, not a traceback after the run folder exists."""
    if os.path.isdir(ca_cert):
        return "is a directory; give a PEM file of CA certificates (a bundle, or the server's own cert)"
    if not os.path.exists(ca_cert):
        return "no such file; give a PEM file of CA certificates"
    try:
        with open(ca_cert, "rb"):
            pass
        _ssl_context(False, ca_cert)
    except OSError as exc:
        if isinstance(exc, ssl.SSLError):
            return (
                f"holds no PEM certificate ({exc.reason or exc}); give a PEM file of CA certificates "
                "(-----BEGIN CERTIFICATE----- blocks)"
            )
        return f"cannot be read ({exc.strerror or exc}); give a readable PEM file of CA certificates"
    return None


@dataclass(frozen=True)
class Access:
    headers: tuple[tuple[str, str], ...] = ()
    insecure: bool = False  # https without certificate or host name checks (--insecure)
    ca_cert: str | None = None  # a PEM bundle to verify the server's certificate with (--ca-cert)

    def __post_init__(self) -> None:
        remember_secrets(self.secret_values())

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
    client read them in), as `Authorization: Bearer`; a key that cannot be sent is one line naming
    where it came from."""
    source, key = "--api-key", api_key
    if not key:
        source, key = next(((name, environ[name]) for name in API_KEY_ENV if environ.get(name)), ("", None))
    if not key:
        return None
    header = ("Authorization", f"Bearer {key}")
    problem = header_problem(*header)
    if problem is not None:
        raise ScenarioError(f"{source}: {problem}")
    return header
