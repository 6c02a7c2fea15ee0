"""Side requests: every request itlaudit makes outside the measured streams (identity, /metrics, /tokenize,
readiness, bisect metadata), through one client with its errors mapped at its boundary."""

from itlaudit import Surface

# What other stages may use, by the module it lives in: they import each name from there, and
# nothing left out (tests/test_layering.py checks every import against this).
SURFACE = Surface(
    __name__,
    {
        "client": (
            "SIDE_TIMEOUT_S",
            "BlockingSideClient",
            "SideClient",
            "describe_connection_failure",
            "server_error_message",
        ),
    },
)
__all__ = SURFACE.names
__getattr__ = SURFACE.getattr
__dir__ = SURFACE.dir
