"""The one redaction policy: every file itlaudit writes (meta.json, the ledger, reports, copied server
logs) passes what it records from environments and command lines through here.

A name containing KEY, TOKEN, SECRET, PASSWORD, PASSWD, PWD, COOKIE, CREDENTIAL or AUTH (any case;
the words below) marks a credential, and so does a value that looks like one whatever its name (a
bearer token, an sk-/hf_/ghp_ key): the name stays, so a reader still sees that HF_TOKEN or --api-key
was set, and the value becomes `***`. Run folders and
ledgers get shared and committed; a credential in one is leaked for good.

"Contains" is judged per word of the name (split at `-`, `_`, `.`): a word that ends in key, token,
secret, password, passwd, pwd, cookie or credential(s), starts with auth, secret, passw or credential,
or is `pass` (HF_TOKEN, --api-key, APIKEY, AUTHORIZATION, DB_PWD, SESSION_COOKIE, --db-passwd); the
shell's PWD and OLDPWD are directories, not passwords. A plain substring test would also mask
--max-num-batched-tokens, --tokenizer and TOKENIZERS_PARALLELISM, which are experiment parameters a
reader must see.

A URL's userinfo is a credential wherever the URL appears (`http://user:pw@host`, fault row N15b): the
password becomes `***` and the user stays (`http://user:***@host`), as for a secret-named flag; a
userinfo without a password is taken for a token (`https://TOKEN@host`) and masked whole. Every
string redact_text, redact_args and redact_json handle is masked so, whatever its key or flag.

Free text is masked by value: redact_text, redact_json, redact_file and every line on the terminal
(RedactedStream, installed over stdout and stderr by the command line) mask each credential this
process knows of (known_secrets): the values it sends (remember_secrets: --api-key, --header, variant
headers, as Access is built), a launched server's (its env and arguments), and the secret-named
variables of its own environment. A server that quotes a key back (a 401's message) is quoted masked,
whichever file or line its text lands in (fault rows 30, N15).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:  # scenario imports access, which imports this module
    from itlaudit.model.launch import LaunchSpec

MASK = "***"
# A credential's name by kind: a word ending in key, token, secret, password, passwd, pwd, cookie or
# credential(s), starting with auth, secret, passw or credential, or the word pass (DB_PASS).
_SECRET_WORD = re.compile(
    r"^(.*(key|token|secret|password|passwd|pwd|cookies?|credentials?)|(auth|secret|passw|credential).*|pass)$",
    re.IGNORECASE,
)
# The shell's working directories: named like a password's abbreviation, never one, and masking their
# value would blank every path in a log.
_NOT_SECRET = frozenset({"PWD", "OLDPWD"})
# A credential by its look, whatever it is called: a bearer token, an OpenAI/Anthropic-style sk- key,
# a Hugging Face, GitHub or Slack token.
_SECRET_VALUE = re.compile(
    r"^(Bearer\s+\S{8,}|sk-[A-Za-z0-9_-]{16,}|hf_[A-Za-z0-9]{16,}|gh[pousr]_[A-Za-z0-9]{20,}"
    r"|github_pat_\w{20,}|xox[abpr]-[\w-]{10,})$"
)
_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+")
# `--api-key=X`, `-e HF_TOKEN=X` (docker), `HF_TOKEN=X` (a shell prefix): NAME=VALUE in one argument.
_ASSIGNMENT = re.compile(r"^(-{0,2}[A-Za-z_][\w.-]*)=(.*)$", re.DOTALL)
# A value this short (`1`, `on`, `true`) is a switch, not a credential; masking it in free text would
# mangle logs and the base64 images of report.html.
_MIN_TEXT_SECRET = 8
# scheme://USERINFO@ — the scheme per RFC 3986, the userinfo up to the first "@" before the host ends.
_URL_USERINFO = re.compile(
    r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^\s/?#@:]*)(?P<password>:[^\s/?#@]*)?@"
)
_REMEMBERED: set[str] = set()  # the credentials this process sends or hands to a server it launched


def remember_secrets(values: Iterable[str]) -> None:
    """Add credentials to the ones every file and terminal line is masked with, from now on."""
    _REMEMBERED.update(value for value in values if len(value) >= _MIN_TEXT_SECRET)


def known_secrets() -> set[str]:
    """Every credential this process knows of: the remembered ones and the secret-named variables of
    its environment (HF_TOKEN, OPENAI_API_KEY, ...), read now, since a launched server inherits them."""
    return _REMEMBERED | secret_values(os.environ, [])


def redact_url(text: str) -> str:
    """`text` with the userinfo of every URL in it masked: user:pw@ -> user:***@, token@ -> ***@."""
    if "@" not in text:
        return text
    return _URL_USERINFO.sub(_masked_userinfo, text)


def _masked_userinfo(match: re.Match[str]) -> str:
    if match["password"] is None:
        return f"{match['scheme']}{MASK}@"
    return f"{match['scheme']}{match['user']}:{MASK}@"


def is_secret_name(name: str) -> bool:
    if name in _NOT_SECRET:
        return False
    return any(_SECRET_WORD.match(word) for word in _WORD_SPLIT.split(name) if word)


def looks_secret(value: str) -> bool:
    """A value that is a credential by its form (a bearer token, an sk-/hf_/ghp_ key), whatever the
    name it came under."""
    return bool(_SECRET_VALUE.match(value.strip()))


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    return {
        key: (MASK if is_secret_name(key) or looks_secret(value) else value) for key, value in env.items()
    }


def redact_args(args: Sequence[str]) -> list[str]:
    """`--api-key X` and `--api-key=X` keep the flag and lose the value; other arguments pass."""
    out: list[str] = []
    mask_next = False
    for arg in args:
        if mask_next and not arg.startswith("--"):
            out.append(MASK)
            mask_next = False
            continue
        mask_next = False
        assignment = _ASSIGNMENT.match(arg)
        if assignment and (is_secret_name(assignment.group(1)) or looks_secret(assignment.group(2))):
            out.append(f"{assignment.group(1)}={MASK}")
        elif arg.startswith("-") and is_secret_name(arg):
            out.append(arg)
            mask_next = True
        elif looks_secret(arg):
            out.append(MASK)
        else:
            out.append(redact_url(arg))
    return out


def redact_json(data: Any) -> Any:
    """A JSON-like value with every secret-named key's text value masked, every list of strings
    treated as a command line, and every string masked as free text (redact_text)."""
    return _redact_json(data, _longest_first(known_secrets()))


def _redact_json(data: Any, values: list[str]) -> Any:
    if isinstance(data, Mapping):
        return {
            key: (MASK if is_secret_name(str(key)) and _is_scalar(value) else _redact_json(value, values))
            for key, value in data.items()
        }
    if isinstance(data, list | tuple):
        if data and all(isinstance(item, str) for item in data):
            return [_mask(item, values) for item in redact_args(data)]
        return [_redact_json(item, values) for item in data]
    if isinstance(data, str):
        return _mask(data, values)
    return data


def _is_scalar(value: Any) -> bool:
    """A value a credential can be: text. A number under a secret-looking name is a model's shape
    (config.json's num_key_value_heads, kv_lora_rank), never a key, and a reader needs it."""
    return isinstance(value, str)


def secret_values(env: Mapping[str, str], args: Sequence[str]) -> set[str]:
    """The credential values in an environment and a command line, for masking them in free text."""
    values = {value for key, value in env.items() if is_secret_name(key) or looks_secret(value)}
    for original, masked in zip(args, redact_args(args), strict=True):
        if masked == MASK:
            values.add(original)
        elif masked != original:
            values.add(original.partition("=")[2])
    return {v for v in values if len(v) >= _MIN_TEXT_SECRET}


def launch_secret_values(launch: LaunchSpec | None, environ: Mapping[str, str]) -> set[str]:
    """The credentials a launched server saw (the environment it inherited from `environ`, its launch
    env, its command line), to mask in its log; none for a server itlaudit did not launch."""
    if launch is None:
        return set()
    return secret_values({**environ, **launch.env}, [*launch.command, *launch.server_args])


def header_secret_values(headers: Iterable[tuple[str, str]]) -> set[str]:
    """The credentials among HTTP headers itlaudit sends (Authorization, X-Api-Key, --header values
    with a secret name): the whole value and, for `Bearer X`-style values, the bare token, which is
    what a server's 401 message tends to quote."""
    values: set[str] = set()
    for name, value in headers:
        if is_secret_name(name):
            values.add(value)
            scheme, _, token = value.partition(" ")
            if token and scheme.lower() in ("bearer", "basic", "token"):
                values.add(token)
    return {v for v in values if len(v) >= _MIN_TEXT_SECRET}


def redact_bytes(data: bytes, values: Iterable[bytes]) -> bytes:
    """redact_text for an already-encoded line (a record on its way to requests.jsonl)."""
    for value in sorted(values, key=len, reverse=True):
        data = data.replace(value, MASK.encode())
    return data


def redact_text(text: str, values: Iterable[str] = ()) -> str:
    """`text` with URL userinfo masked and every credential known to this process (known_secrets),
    and any in `values`, replaced by MASK."""
    return _mask(text, _longest_first(known_secrets().union(values)))


def _longest_first(values: set[str]) -> list[str]:
    """The order to mask in: one secret may contain another."""
    return sorted(values, key=len, reverse=True)


def _mask(text: str, ordered: list[str]) -> str:
    text = redact_url(text)
    for value in ordered:
        text = text.replace(value, MASK)
    return text


def redact_file(path: Path, values: Iterable[str] = ()) -> None:
    """Mask credentials in a file written by someone else (a server's log); best effort."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
        redacted = redact_text(text, values)
        if redacted != text:
            path.write_text(redacted, encoding="utf-8")
    except OSError:
        return


class RedactedStream:
    """A text stream that passes every write through redact_text before `stream` sees it: over
    sys.stdout and sys.stderr, it is the one place every line the tool prints is masked (progress,
    phase lines, a server's message quoted in an error, a traceback). Everything else (isatty,
    fileno, flush, encoding) is the stream's own, so rich still sees a terminal where there is one."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(redact_text(text))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def redact_terminal() -> None:
    """Mask everything this process prints from now on (idempotent)."""
    import sys

    if not isinstance(sys.stdout, RedactedStream):
        sys.stdout = RedactedStream(sys.stdout)
    if not isinstance(sys.stderr, RedactedStream):
        sys.stderr = RedactedStream(sys.stderr)
