"""JSON as a type: what a wire payload or a parsed file is before it is validated into a struct.

Data with a known shape travels between stages as a typed struct (RunSummary, RequestRecord,
CompareResult, ...). What stays free-form is JSON itself at the edges: a request body's extra fields,
a server's answer before it is checked, a TOML table before its keys are read. Those are typed as
JSON (recursive, so a reader must narrow with isinstance before using a value) rather than as
`dict[str, Any]`, which would let an unchecked value flow on as if it had been validated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeAlias

JSONScalar: TypeAlias = str | int | float | bool | None
JSONValue: TypeAlias = JSONScalar | list["JSONValue"] | dict[str, "JSONValue"]
# A JSON object being built or decoded (json.loads gives one of these when the text is an object).
JSONObject: TypeAlias = dict[str, JSONValue]
# What a function that only reads JSON takes: covariant, so a `dict[str, list[str]]` or a
# `list[dict[str, int]]` built elsewhere is accepted without copying.
ReadOnlyJSON: TypeAlias = JSONScalar | Sequence["ReadOnlyJSON"] | Mapping[str, "ReadOnlyJSON"]
JSONMapping: TypeAlias = Mapping[str, ReadOnlyJSON]
