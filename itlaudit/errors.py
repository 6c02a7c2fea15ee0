"""Every error itlaudit raises on purpose, in one tree, so a caller can catch as narrowly as it likes
and the CLI can turn any of them into one line and an exit code instead of a traceback.

    ItlauditError                 exit_code 2: the message is the whole story, with what to do
    ├── ScenarioError             a scenario file is missing, unparsable or has a bad key
    │   ├── DatasetError          a [workload.dataset] key or file is wrong (carries the key)
    │   └── SuiteError            a smoke suite is missing, unparsable or names what does not exist
    ├── ServerUnreachableError    no answer at all from the server
    │   ├── ServerTimeout         a side request got no complete answer within its timeout
    │   └── ConnectFailed ─┐      (also a TransportError)
    ├── ServerRejectedError       the server answered a request with 4xx/5xx
    │   ├── ServerStatusError     a side request's answer is not 2xx (status, headers, body kept)
    │   └── ServerAnswerError     a side request's 2xx answer is not the JSON asked for
    │       └── AnswerTooLarge    a side request's answer is longer than its caller reads
    ├── LaunchError               a server we started died or never became ready
    │   └── TestbedError          installing the CPU testbed or its tiny model failed
    ├── RecordsError              a run-folder file is missing or malformed
    ├── RunDirError               the run folder cannot be used (holds a run, unwritable)
    ├── RunInterrupted            SIGINT/SIGTERM ended a run; exit_code 130 or 143 per instance
    ├── DuplicateRunError         --no-repeat and the ledger already holds this experiment
    ├── CaptureWorkerError        a capture worker process died
    ├── MetricsParseError         /metrics is not Prometheus text
    ├── SweepError                a sweep option or sweep folder is unusable
    ├── BisectError               bad bisect input, or an end that does not behave as claimed
    ├── BuildUnavailable          a build cannot be had: the bisect probe is a skip, never a bad
    ├── TrackError                a history (--db) that cannot be opened or read, or a folder it cannot record
    ├── SimError                  the simulator refused a request (rendered as vLLM's error body)
    ├── EventTooLarge             a streamed event grew past the reader's limit (a record's stream_error)
    ├── ClusterError              --cluster: Ray missing, no cluster there, or an actor would not start
    └── TransportError            the streaming HTTP connection failed
        ├── ConnectFailed         no TCP connection (name, refusal, unreachable)
        │   └── ConnectTimeout    connecting took longer than the connect timeout
        ├── TLSFailure            handshake or record failed (trust, host name)
        ├── ConnectionDropped     closed or reset before the response was complete
        └── BadFraming            not a valid HTTP/1.1 response

`exit_code` lives on the base class and the CLI (cli/app.py `main`) exits with whatever the caught
error carries, so a subclass that needs another code sets the attribute and nothing else changes.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = [
    "AnswerTooLarge",
    "BadFraming",
    "BisectError",
    "BuildUnavailable",
    "CaptureWorkerError",
    "ClusterError",
    "ConnectFailed",
    "ConnectTimeout",
    "ConnectionDropped",
    "DatasetError",
    "DuplicateRunError",
    "EventTooLarge",
    "ItlauditError",
    "LaunchError",
    "MetricsParseError",
    "RecordsError",
    "RunDirError",
    "RunInterrupted",
    "ScenarioError",
    "ServerAnswerError",
    "ServerRejectedError",
    "ServerStatusError",
    "ServerTimeout",
    "ServerUnreachableError",
    "SimError",
    "SuiteError",
    "SweepError",
    "TLSFailure",
    "TestbedError",
    "TrackError",
    "TransportError",
]


class ItlauditError(Exception):
    """Base: the message is a complete one-line explanation with what to do about it."""

    exit_code: int = 2


class ScenarioError(ItlauditError):
    """A scenario file is missing, unparsable or has a bad key."""


class DatasetError(ScenarioError):
    """A dataset key or file is wrong: `key` names the [workload.dataset] key, the message the fix.
    The scenario loader adds the file and line; raised bare it still reads as one line."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


class SuiteError(ScenarioError):
    """A smoke suite is missing, unparsable, or names something that does not exist."""


class ServerUnreachableError(ItlauditError):
    """The server could not be connected to at all. `reason`, where set, is what the network said,
    without the URL (a caller that groups failures by host, like bisect's wheel index, shows it)."""

    reason: str = ""


class ServerRejectedError(ItlauditError):
    """The server answered a preflight request with a 4xx/5xx (message is vLLM's own)."""


class ServerTimeout(ServerUnreachableError):
    """A side request (side/client.py) got no complete answer within its timeout."""


class ServerStatusError(ServerRejectedError):
    """A side request was answered with a status that is not 2xx. The answer is kept, so a caller
    with its own reading of a status (GitHub's rate limit, an index's missing page) can give it.
    (Every argument but the message has a default so that pickle, which rebuilds an exception from
    its message and then restores its attributes, can copy it across processes.)"""

    def __init__(
        self, message: str, *, status: int = 0, headers: Mapping[str, str] | None = None, body: bytes = b""
    ) -> None:
        super().__init__(message)
        self.status = status
        self.headers: Mapping[str, str] = headers or {}
        self.body = body


class ServerAnswerError(ServerRejectedError):
    """A side request was answered 2xx with a body that is not the JSON (or the shape) asked for."""


class AnswerTooLarge(ServerAnswerError):
    """A side request's answer is longer than its caller reads (a /metrics or DCGM page over the
    samplers' page limit): the read stops there instead of holding and parsing the whole of it."""


class LaunchError(ItlauditError):
    """A server we started died or never became ready; the message carries its log tail."""


class RecordsError(ItlauditError):
    """A requests.jsonl (or other run-folder file) is missing or malformed."""


class TestbedError(LaunchError):
    """Installing the vLLM CPU testbed or building its tiny model failed; names the step and log."""

    __test__ = False  # keep pytest from collecting it as a test class (name starts with "Test")


class RunDirError(ItlauditError):
    """The run folder cannot be used: it already holds a run (and --append was not given), or it
    cannot be created or written (permission, read-only file system)."""


class RunInterrupted(ItlauditError):
    """SIGINT or SIGTERM stopped a run after its summary and report were written for what finished.
    Not a KeyboardInterrupt: the CLI framework would turn that into a bare abort and lose the line."""

    def __init__(self, signal_name: str, exit_code: int, message: str) -> None:
        super().__init__(message)
        self.signal_name = signal_name
        self.exit_code = exit_code


class DuplicateRunError(ItlauditError):
    """`--no-repeat` and the fingerprint is already in the ledger; the message names the earlier run."""


class CaptureWorkerError(ItlauditError):
    """A capture worker process died; what it finished is kept."""


class MetricsParseError(ItlauditError):
    """/metrics did not parse as Prometheus text."""


class SweepError(ItlauditError):
    """A sweep option or sweep folder is unusable; the message says which and how to fix it."""


class BisectError(ItlauditError):
    """Bad input (range, commit, option) or an end of the range that does not behave as claimed."""


class TrackError(ItlauditError):
    """A history (--db) that cannot be opened or read, or a run folder it cannot record."""


class BuildUnavailable(ItlauditError):
    """A build that cannot be found, downloaded or installed: the probe is a skip, never a bad."""


class TransportError(ItlauditError):
    """The streaming HTTP connection failed; the message names host:port and what happened."""


class ConnectFailed(TransportError, ServerUnreachableError):
    """No TCP connection: the name did not resolve or every address refused or was unreachable."""


class ConnectTimeout(ConnectFailed):
    """Connecting (TCP and, for https, the TLS handshake) took longer than the connect timeout."""


class TLSFailure(TransportError):
    """The TLS handshake or a TLS record failed: certificate not trusted, wrong host name, bad record."""


class ConnectionDropped(TransportError):
    """The server closed or reset the connection before the response was complete."""


class BadFraming(TransportError):
    """The bytes received are not a valid HTTP/1.1 response (head or chunked framing)."""


class SimError(ItlauditError):
    """The simulator refused a request before streaming it; the client gets vLLM's ``{"error": ...}`` body
    with this HTTP status (serve/sim/wire.py renders it)."""

    def __init__(self, status: int, err_type: str, message: str, param: str | None) -> None:
        super().__init__(message)
        self.status = status
        self.err_type = err_type
        self.param = param


class EventTooLarge(ItlauditError):
    """A server-sent event grew past the stream reader's limit without ending: the client ends the
    record there as a stream_error (the chunks before it kept), so an endless line cannot grow the
    client without bound. Never raised past the client."""


class ClusterError(ItlauditError):
    """`--cluster`: Ray missing, no cluster at the address, or an actor that would not start."""
