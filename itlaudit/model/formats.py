"""Format versions of the files itlaudit writes: one definition, read by every writer and reader.

A run folder outlives the itlaudit that wrote it (`itlaudit report`/`diff`/`ledger` read folders of
any age), so each JSON file in it carries `format`: a reader can then tell an old folder from a new
one instead of guessing from which keys are there. Files written before versions existed have no
`format` key: they are format 1 and read as they are. A reader accepts the current format and the one
before; anything else is one line naming the file, its format and what to do.

bisect.json (bisect/state.py) and the simulator's send log (model/sendlog.py) keep their own
versions: they were versioned first and are read by one module each.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from itlaudit.errors import RecordsError

FORMAT_KEY = "format"
# 1: unversioned (every file before versions). 2: the same content with `format` in meta.json,
# summary.json, compare.json, sweep.json, sweep-config.json, point.json, invariance.json, the ledger's
# lines and the --save-result file; meta.json also says `records_format`.
FORMAT = 2
PREVIOUS_FORMAT = 1
READABLE_FORMATS = (PREVIOUS_FORMAT, FORMAT)
# requests.jsonl's record schema (model/records.py), stated once per folder in meta.json rather than
# on each line: the capture path writes a line per request and a folder's records share one writer.
RECORDS_FORMAT_KEY = "records_format"
RECORDS_FORMAT = 1


_V = TypeVar("_V")


def stamped(data: Mapping[str, _V]) -> dict[str, _V | int]:
    """`data` with the current format first (a format a reader left in it is replaced); JSON in, JSON
    out, so a writer's typed JSON object stays typed."""
    return {FORMAT_KEY: FORMAT, **{k: v for k, v in data.items() if k != FORMAT_KEY}}


def format_of(data: Mapping[str, Any], key: str = FORMAT_KEY) -> object:
    """The format a file says it is; a file without the key is the previous, unversioned format."""
    return data.get(key, PREVIOUS_FORMAT)


def check_format(
    where: Path | str,
    data: object,
    *,
    key: str = FORMAT_KEY,
    current: int = FORMAT,
    readable: tuple[int, ...] = READABLE_FORMATS,
) -> None:
    """Raise one RecordsError line when `data` (a file's parsed JSON, or one ledger line) is in a
    format this itlaudit does not read: newer (upgrade itlaudit), older (an itlaudit of its time reads
    it) or not a format at all. Data that is not an object is the caller's to refuse."""
    if not isinstance(data, Mapping):
        return
    found = format_of(data, key)
    if type(found) is int:  # not a bool: True == 1 would read as format 1
        if found in readable:
            return
        if found > current:
            raise RecordsError(
                f"{where} is {key} {found}, newer than this itlaudit reads ({current}); upgrade itlaudit"
            )
        raise RecordsError(
            f"{where} is {key} {found}, older than this itlaudit reads ({', '.join(map(str, readable))}); "
            "read it with the itlaudit that wrote it"
        )
    raise RecordsError(f"{where}: {key} {found!r} is not a format version; it was not written by itlaudit")
