"""What a run's result files carry to say which run they are: the command line that made it (secrets
masked), a free `--label` and `--metadata KEY=VALUE` pairs, and vllm bench's `--backend` when a pasted
line gave it, as vllm bench serve's result files do."""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypedDict

from itlaudit.errors import ScenarioError
from itlaudit.model.redact import redact_args, redact_text


class LabelsMeta(TypedDict):
    """The run's labels as meta.json holds them (None where the run had no command line)."""

    command_line: str | None
    label: str | None
    metadata: dict[str, str]
    backend: str | None  # vllm bench's --backend, as given (the result file's `backend`)


@dataclass(frozen=True)
class RunLabels:
    """meta.json's "command_line", "label" and "metadata"; every result file is written from there."""

    command_line: str
    label: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    backend: str | None = None

    @classmethod
    def from_argv(
        cls,
        argv: Sequence[str],
        label: str | None = None,
        metadata: dict[str, str] | None = None,
        backend: str | None = None,
    ) -> RunLabels:
        """`--api-key X` loses its value by name; a value sent in a header (`--header 'Authorization:
        Bearer X'`) is masked wherever it appears (redact_text knows every credential sent)."""
        line = redact_text(shlex.join(redact_args(list(argv))))
        return cls(command_line=line, label=label, metadata=dict(metadata or {}), backend=backend)

    def to_meta(self) -> LabelsMeta:
        return {
            "command_line": self.command_line,
            "label": self.label,
            "metadata": dict(self.metadata),
            "backend": self.backend,
        }


def parse_metadata(pairs: Iterable[str]) -> dict[str, str]:
    """--metadata KEY=VALUE (repeatable), as vllm bench serve takes it."""
    metadata: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ScenarioError(f"--metadata {pair!r}: expected KEY=VALUE")
        metadata[key.strip()] = value
    return metadata
