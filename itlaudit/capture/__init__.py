"""Capture: the I/O side of a run — connect, stream, stamp every read at the socket, keep the raw bytes."""
