"""Three-valued binary search for the first build where the regression shows (cargo-bisect-rustc's
least-satisfying search with Yes/No/Unknown).

Index 0 is known "no" and the last index "yes"; each probe answers yes, no or unknown (skip: not
available; unknown: no clear verdict). An unknown midpoint is not a dead end: the search walks right to
the edge of the unknown run and probes there, then left, so a run of missing nightlies costs only its
own length. When every build between the last "no" and the first "yes" is unknown the answer is that
range, reported honestly instead of a guess. With K probes a round (multisection, `--parallel K`) the
K points cut the range into K + 1 equal parts. Pure: no I/O, replayable from bisect.json on resume.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum


class Answer(StrEnum):
    YES = "yes"  # the regression (or, with --find-fix, the fix) is present
    NO = "no"
    UNKNOWN = "unknown"


@dataclass
class Search:
    size: int
    answers: dict[int, Answer] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.size < 2:
            raise ValueError("a search needs at least two builds")
        self.answers.setdefault(0, Answer.NO)
        self.answers.setdefault(self.size - 1, Answer.YES)

    def record(self, index: int, answer: Answer) -> None:
        self.answers[index] = answer

    @property
    def bounds(self) -> tuple[int, int]:
        """(last known no, first known yes above it): the regression lies in (lo, hi]."""
        lo = max(i for i, a in self.answers.items() if a is Answer.NO)
        hi = min(i for i, a in self.answers.items() if a is Answer.YES and i > lo)
        return lo, hi

    def next_index(self, lo: int | None = None, hi: int | None = None) -> int | None:
        """The next build to probe, or None when (lo, hi] cannot be narrowed further."""
        if lo is None or hi is None:
            lo, hi = self.bounds
        mid = (lo + hi) // 2
        if mid <= lo:
            return None
        if mid not in self.answers:
            return mid
        candidates: list[int] = [*range(mid + 1, hi), *range(mid - 1, lo, -1)]
        for index in candidates:
            if index not in self.answers:
                return index
        return None

    def next_round(self, k: int) -> list[int]:
        """Up to k builds to probe at once (multisection): the points that cut (lo, hi) into k + 1
        equal parts, each moved to the nearest build not yet answered or chosen (the right one on a
        tie), so a clean search needs about log_(k+1) N rounds; every open build when k or fewer are
        left. k = 1 is the binary search's own choice, unknown runs walked as next_index walks them."""
        if k == 1:
            index = self.next_index()
            return [] if index is None else [index]
        lo, hi = self.bounds
        open_builds = [i for i in range(lo + 1, hi) if i not in self.answers]
        if len(open_builds) <= k:
            return open_builds
        chosen: list[int] = []
        for part in range(1, k + 1):
            ideal = lo + round(part * (hi - lo) / (k + 1))
            free = [i for i in open_builds if i not in chosen]
            chosen.append(min(free, key=lambda i: (abs(i - ideal), i < ideal)))
        return sorted(chosen)

    def next_after(self, index: int) -> list[int]:
        """The builds probed next if `index` answers yes or no: what is worth preparing meanwhile."""
        lo, hi = self.bounds
        if not lo < index < hi:
            return []
        guesses = [self.next_index(lo, index), self.next_index(index, hi)]
        return [g for g in dict.fromkeys(guesses) if g is not None and g != index]

    @property
    def done(self) -> bool:
        return self.next_index() is None

    @property
    def candidates(self) -> list[int]:
        """Indices that may hold the first yes: one when the answer is exact, more when unknowns hide it."""
        lo, hi = self.bounds
        return list(range(lo + 1, hi + 1))

    def remaining_estimate(self, k: int = 1) -> int:
        """Rounds left for a clean search of what is still open, k probes a round (unknowns can add
        more); with k = 1 a round is one probe."""
        lo, hi = self.bounds
        open_count = sum(1 for i in range(lo + 1, hi) if i not in self.answers)
        return math.ceil(math.log(open_count + 1, k + 1) - 1e-9) if open_count else 0
