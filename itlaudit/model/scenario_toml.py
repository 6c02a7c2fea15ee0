"""Reading a scenario's TOML with errors that point at the line: key lookup and typed getters; and
writing one back (`--save-scenario`).

Every getter raises ScenarioError as `file:line: `table.key` problem`, so a typo costs one line of error.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from itlaudit.errors import ScenarioError

__all__ = [
    "Located",
    "dump_toml",
    "get_value",
    "int_list",
    "reject_unknown_keys",
    "require_positive",
    "str_list",
]


class Located:
    """Finds the line of a key in the TOML text, so validation errors can point at it."""

    _header = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*$")

    def __init__(self, path: Path, text: str) -> None:
        self.path = path
        self.lines = text.splitlines()

    def line_of(self, table: str, key: str) -> int | None:
        current = ""
        key_re = re.compile(rf"^\s*{re.escape(key)}\s*=")
        for number, line in enumerate(self.lines, 1):
            header = self._header.match(line)
            if header:
                current = header.group(1)
                continue
            if current == table and key_re.match(line):
                return number
        return None

    def in_variant(self, index: int) -> Located:
        """The same file, with `variants` keys looked up in the index-th [[variants]] table only, so an
        error in the second table points at the second table."""
        return _VariantLocated(self.path, self.lines, index)

    def error(self, table: str, key: str, problem: str) -> ScenarioError:
        where = f"{self.path}"
        line = self.line_of(table, key)
        if line is not None:
            where += f":{line}"
        dotted = f"{table}.{key}" if table else key
        return ScenarioError(f"{where}: `{dotted}` {problem}")


class _VariantLocated(Located):
    """Line lookup confined to one [[variants]] table (and its [variants.launch])."""

    def __init__(self, path: Path, lines: list[str], index: int) -> None:
        self.path = path
        self.lines = lines
        self.index = index

    def line_of(self, table: str, key: str) -> int | None:
        starts = [n for n, line in enumerate(self.lines) if re.match(r"^\s*\[\[\s*variants\s*\]\]", line)]
        if self.index >= len(starts):
            return None  # inline `variants = [...]`: no table of its own
        end = starts[self.index + 1] if self.index + 1 < len(starts) else len(self.lines)
        region = Located(self.path, "\n".join(self.lines[starts[self.index] : end]))
        found = region.line_of(table, key)
        if found is None and table == "variants":
            return starts[self.index] + 1  # a missing key: point at its table
        return starts[self.index] + found if found is not None else None


def get_value(
    src: dict[str, Any],
    loc: Located,
    table: str,
    key: str,
    kind: type | tuple[type, ...],
    default: Any = ...,
) -> Any:
    if key not in src:
        if default is ...:
            raise loc.error(table, key, "is missing; add it")
        return default
    value = src[key]
    # bool is an int subclass: a `true` where a number belongs is a mistake worth naming.
    wrong_bool = isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,))
    if wrong_bool or not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise loc.error(table, key, f"must be {names}, got {type(value).__name__} {value!r}")
    return value


def require_positive(value: int, loc: Located, table: str, key: str) -> int:
    if value < 1:
        raise loc.error(table, key, f"must be at least 1, got {value}")
    return value


def int_list(src: dict[str, Any], loc: Located, table: str, key: str) -> list[int]:
    values = get_value(src, loc, table, key, list, [])
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise loc.error(table, key, "must be a list of integer token ids")
    return values


def str_list(src: dict[str, Any], loc: Located, table: str, key: str) -> list[str]:
    values = get_value(src, loc, table, key, list, [])
    if not all(isinstance(v, str) for v in values):
        raise loc.error(table, key, "must be a list of strings")
    return values


def reject_unknown_keys(src: dict[str, Any], allowed: set[str], loc: Located, table: str) -> None:
    for key in src:
        if key not in allowed:
            raise loc.error(table, key, f"is not a known key (known: {', '.join(sorted(allowed))})")


# Tables written as [headers] (the scenario's own layout); any other table value is written inline.
_SECTIONS = ("workload", "workload.dataset", "goodput", "variants.launch")
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(key: str) -> str:
    return key if _BARE_KEY.match(key) else json.dumps(key, ensure_ascii=False)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, int | str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return (
            "{ " + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + " }" if value else "{}"
        )
    raise TypeError(f"cannot write {type(value).__name__} {value!r} as TOML")


def _section(
    lines: list[str], title: str, table: str, src: dict[str, Any], notes: dict[tuple[str, str], str]
) -> None:
    """A table's plain keys (each with its note as a comment), then its sub-tables as [sections]."""
    if title:
        lines += ["", title]
    subtables = []
    for key, value in src.items():
        dotted = f"{table}.{key}" if table else key
        if isinstance(value, dict) and dotted in _SECTIONS:
            subtables.append((key, value))
        elif not (isinstance(value, list) and value and all(isinstance(v, dict) for v in value)):
            note = notes.get((table, key))
            lines.append(f"{_key(key)} = {_value(value)}" + (f"  # {note}" if note else ""))
    for key, value in subtables:
        dotted = f"{table}.{key}" if table else key
        _section(lines, f"[{dotted}]", dotted, value, notes)
    for key, value in src.items():  # arrays of tables ([[variants]]) come last
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for item in value:
                _section(lines, f"[[{key}]]", key, item, notes)


def dump_toml(raw: dict[str, Any], header: list[str], notes: dict[tuple[str, str], str]) -> str:
    """Scenario tables as TOML that tomllib reads back to the same tables: `header` as opening comment
    lines, and `notes[(table, key)]` as the comment after that key."""
    lines = [f"# {line}" if line else "#" for line in header]
    _section(lines, "", "", raw, notes)
    return "\n".join(lines).lstrip("\n") + "\n"
