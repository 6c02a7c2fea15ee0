"""Reading a scenario's TOML with errors that point at the line: key lookup and typed getters; and
writing one back (`--save-scenario`).

Every getter raises ScenarioError as `file:line: `table.key` problem`, so a typo costs one line of error.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar, overload

from itlaudit.errors import ScenarioError


class Located:
    """Finds the line of a key in the TOML text, so validation errors can point at it."""

    _header = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*$")

    def __init__(self, path: Path, text: str, flags: dict[tuple[str, str], str] | None = None) -> None:
        self.path = path
        self.lines = text.splitlines()
        # (table, key) -> the command-line flag that set it: its errors name the flag, not a line.
        self.flags = flags or {}

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
        dotted = f"{table}.{key}" if table else key
        flag = self.flags.get((table, key))
        if flag is not None:
            return ScenarioError(f"{flag}: `{dotted}` {problem}")
        where = f"{self.path}"
        line = self.line_of(table, key)
        if line is not None:
            where += f":{line}"
        return ScenarioError(f"{where}: `{dotted}` {problem}")


class _VariantLocated(Located):
    """Line lookup confined to one [[variants]] table (and its [variants.launch])."""

    def __init__(self, path: Path, lines: list[str], index: int) -> None:
        self.path = path
        self.lines = lines
        self.flags = {}
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


T = TypeVar("T")
D = TypeVar("D")


@overload
def get_value(
    src: Mapping[str, object], loc: Located, table: str, key: str, kind: type[T] | tuple[type[T], ...]
) -> T: ...


@overload
def get_value(
    src: Mapping[str, object],
    loc: Located,
    table: str,
    key: str,
    kind: type[T] | tuple[type[T], ...],
    default: D,
) -> T | D: ...


def get_value(
    src: Mapping[str, object],
    loc: Located,
    table: str,
    key: str,
    kind: type[T] | tuple[type[T], ...],
    default: object = ...,
) -> object:
    """`src[key]` checked to be a `kind` (the return type follows it, so callers need no cast);
    `default` where the key is absent, or a one-line error naming the key when no default is given."""
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


def get_table(
    src: Mapping[str, object], loc: Located, table: str, key: str, default: Mapping[str, object] | None = None
) -> Mapping[str, object]:
    """A sub-table (`key = { ... }` or `[table.key]`): TOML keys are strings, its values are read
    with the getters here. Missing without a default is an error naming the key."""
    value: Mapping[str, object] = (
        get_value(src, loc, table, key, dict)
        if default is None
        else get_value(src, loc, table, key, dict, default)
    )
    return value


def _shown(value: float) -> str:
    """A bound as the user would type it: 1000000, 0.001, 1e+06 only when it is long."""
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return f"{value:g}"


@dataclass(frozen=True)
class Bound:
    """The values a numeric key takes: finite, within [lo, hi] (`(lo, hi]` where lo itself means
    nothing, e.g. a rate or a timeout of 0). Every numeric key and flag is checked against one, so
    nan, inf and absurd magnitudes end in one line naming the range instead of a silent default, an
    unbounded wait or a MemoryError far from the key that caused it."""

    lo: float
    hi: float
    open_low: bool = False
    unit: str = ""
    integer: bool = False  # a count: the message says "an integer"

    def holds(self, value: float) -> bool:
        if not math.isfinite(value) or value > self.hi:
            return False
        return value > self.lo if self.open_low else value >= self.lo

    def __str__(self) -> str:
        low = "(" if self.open_low else "["
        unit = f" {self.unit}" if self.unit else ""
        return f"{low}{_shown(self.lo)}, {_shown(self.hi)}]{unit}"

    def problem(self, value: float) -> str | None:
        """What is wrong with `value` (the end of a one-line error after the key's name), or None."""
        if self.holds(value):
            return None
        what = "an integer" if self.integer else "a finite number"
        return f"must be {what} in {self}, got {value!r}"


def check_bound(value: float, bound: Bound, loc: Located, table: str, key: str) -> None:
    """One line naming the key, the range and the value, where the value is out of it."""
    problem = bound.problem(value)
    if problem is not None:
        raise loc.error(table, key, problem)


_Number = TypeVar("_Number", bound=float)


@overload
def get_number(
    src: Mapping[str, object],
    loc: Located,
    table: str,
    key: str,
    kind: type[_Number] | tuple[type[_Number], ...],
    bound: Bound,
) -> _Number: ...


@overload
def get_number(
    src: Mapping[str, object],
    loc: Located,
    table: str,
    key: str,
    kind: type[_Number] | tuple[type[_Number], ...],
    bound: Bound,
    default: D,
) -> _Number | D: ...


def get_number(
    src: Mapping[str, object],
    loc: Located,
    table: str,
    key: str,
    kind: type[_Number] | tuple[type[_Number], ...],
    bound: Bound,
    default: object = ...,
) -> object:
    """`get_value` for a number, checked against `bound` (a default is taken as it is)."""
    if key not in src:
        return get_value(src, loc, table, key, kind, default)
    value: float = get_value(src, loc, table, key, kind)
    check_bound(value, bound, loc, table, key)
    return value


TOKEN_ID = Bound(0, 2**31 - 1, integer=True)  # vocabularies are far smaller; ids are int32 in every engine
# A length in tokens (a prompt, max_tokens): the longest context any served model offers (10M).
SEQUENCE_TOKENS = Bound(1, 10_000_000, integer=True)


def int_list(src: Mapping[str, object], loc: Located, table: str, key: str) -> list[int]:
    values: list[object] = get_value(src, loc, table, key, list, [])
    ids = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
    if len(ids) != len(values):
        raise loc.error(table, key, "must be a list of integer token ids")
    for value in ids:
        check_bound(value, TOKEN_ID, loc, table, key)
    return ids


def str_list(src: Mapping[str, object], loc: Located, table: str, key: str) -> list[str]:
    values: list[object] = get_value(src, loc, table, key, list, [])
    strings = [v for v in values if isinstance(v, str)]
    if len(strings) != len(values):
        raise loc.error(table, key, "must be a list of strings")
    return strings


def reject_unknown_keys(src: Mapping[str, object], allowed: set[str], loc: Located, table: str) -> None:
    for key in src:
        if key not in allowed:
            raise loc.error(table, key, f"is not a known key (known: {', '.join(sorted(allowed))})")


# Tables written as [headers] (the scenario's own layout); any other table value is written inline.
_SECTIONS = ("workload", "workload.dataset", "goodput", "variants.launch")
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(key: str) -> str:
    return key if _BARE_KEY.match(key) else json.dumps(key, ensure_ascii=False)


def _value(value: object) -> str:
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
    lines: list[str], title: str, table: str, src: Mapping[str, object], notes: dict[tuple[str, str], str]
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


def dump_toml(raw: Mapping[str, object], header: list[str], notes: dict[tuple[str, str], str]) -> str:
    """Scenario tables as TOML that tomllib reads back to the same tables: `header` as opening comment
    lines, and `notes[(table, key)]` as the comment after that key."""
    lines = [f"# {line}" if line else "#" for line in header]
    _section(lines, "", "", raw, notes)
    return "\n".join(lines).lstrip("\n") + "\n"
