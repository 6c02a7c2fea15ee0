"""Name → thing tables for what a user picks by name: launch kinds, bisect providers, verdict judges.

One table per choice means the names are spelled once, where the behaviour is registered, and every
place that validates, lists or dispatches reads the table (mozregression's `@REGISTRY.register`).
An unknown name is one line naming the option and every known value, raised as the caller's error
type so the CLI exits 2 with it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from itlaudit.errors import ItlauditError

T = TypeVar("T")


class Registry(Generic[T]):
    """`what` is how the user spells the choice in an error line (`launch kind`, `--provider`);
    `hint` is added to that line where a bare list of names would not say enough."""

    def __init__(self, what: str, error: type[ItlauditError], hint: str = "") -> None:
        self.what = what
        self.error = error
        self.hint = hint
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: file the decorated function or class under `name`; a second use of a name is a
        programming error, caught at import."""

        def add(entry: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.what} {name!r} is registered twice")
            self._entries[name] = entry
            return entry

        return add

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            hint = f"; {self.hint}" if self.hint else ""
            raise self.error(f"{self.what} {name!r}: use one of {', '.join(self)}{hint}") from None

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)
