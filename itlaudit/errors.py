"""Error types: every user-facing failure is one of these, so the CLI can print one line, not a traceback."""

from __future__ import annotations


class ItlauditError(Exception):
    """Base: the message is a complete one-line explanation with what to do about it."""

    exit_code = 2


class ScenarioError(ItlauditError):
    """A scenario file is missing, unparsable or has a bad key."""


class ServerUnreachableError(ItlauditError):
    """The server could not be connected to at all."""


class ServerRejectedError(ItlauditError):
    """The server answered a preflight request with a 4xx/5xx (message is vLLM's own)."""


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


class ClusterError(ItlauditError):
    """`--cluster`: Ray missing, no cluster at the address, or an actor that would not start."""
