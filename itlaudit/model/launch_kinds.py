"""The launch kinds a scenario or smoke suite may name, read here because model/ may not import the
launcher (serve/ is a higher stage). serve/launcher.py's LAUNCHERS registers what each kind does;
tests/test_launcher.py keeps the two sets equal, so a new kind is added in both or fails there.
"""

from __future__ import annotations

__all__ = ["LAUNCH_KINDS"]

# kind → the [variants.launch] key it cannot start without (None: nothing beyond the kind).
LAUNCH_KINDS: dict[str, str | None] = {
    "python": "python",  # an interpreter or venv with vLLM installed
    "docker": "image",  # a vllm/vllm-openai style image
    "command": "command",  # any argv, with {port} {model} {host} filled in
    "url": None,  # attach to a server someone else started
}
