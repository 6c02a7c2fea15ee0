"""The launch kinds a scenario or smoke suite may name, read here because model/ may not import the
launcher (serve/ is a higher stage). serve/launcher.py's LAUNCHERS registers what each kind does;
tests/test_launcher.py keeps the two sets equal, so a new kind is added in both or fails there.
"""

from __future__ import annotations

__all__ = ["ATTACH_KIND", "LAUNCH_KINDS", "STARTED_KINDS", "launch_kind_problem"]

# Attach to a server someone else started. Workflows use it for a URL they were given; a scenario or a
# smoke suite says the same with the variant's own `url` key, so a [launch] table never names it.
ATTACH_KIND = "url"
# The kinds that start a server → the [launch] key each cannot start without.
STARTED_KINDS: dict[str, str] = {
    "python": "python",  # an interpreter or venv with vLLM installed
    "docker": "image",  # a vllm/vllm-openai style image
    "command": "command",  # any argv, with {port} {model} {host} filled in
}
LAUNCH_KINDS: tuple[str, ...] = (*STARTED_KINDS, ATTACH_KIND)


def launch_kind_problem(kind: str) -> str | None:
    """Why a [launch] table may not name `kind` (None: it may): the one message scenarios and smoke
    suites give."""
    if kind == ATTACH_KIND:
        return (
            f"is {kind!r}, which attaches to a running server: give the variant a `url` instead of a "
            "launch table"
        )
    if kind not in STARTED_KINDS:
        return f"must be one of {', '.join(STARTED_KINDS)}, got {kind!r}"
    return None
