"""The three-valued search alone: probe bounds, stepping around unknown runs, honest ranges."""

from __future__ import annotations

import math

import pytest

from itlaudit.bisect.search import Answer, Search


def _bisect(size: int, first_bad: int, unknown: frozenset[int] = frozenset()) -> tuple[Search, list[int]]:
    search = Search(size)
    probed: list[int] = []
    while (index := search.next_index()) is not None:
        assert index not in probed, "a build is never probed twice"
        probed.append(index)
        answer = Answer.UNKNOWN if index in unknown else Answer.YES if index >= first_bad else Answer.NO
        search.record(index, answer)
    return search, probed


@pytest.mark.parametrize("size", [2, 3, 12, 130])
def test_every_culprit_found_within_the_probe_bound(size: int) -> None:
    bound = math.ceil(math.log2(size))  # plus the 2 end checks the bisector does first
    for first_bad in range(1, size):
        search, probed = _bisect(size, first_bad)
        assert search.candidates == [first_bad]
        assert len(probed) + 2 <= bound + 2


def test_unknown_midpoint_is_stepped_around_and_answer_stays_exact() -> None:
    # A run of unavailable nightlies right where the midpoints fall.
    unknown = frozenset(range(60, 70))
    search, probed = _bisect(130, 97, unknown)
    assert search.candidates == [97]
    assert 65 in probed and 70 in probed  # walked to the edge of the run, then continued


def test_unknowns_next_to_the_culprit_give_the_range_not_a_guess() -> None:
    search, _ = _bisect(12, 7, frozenset({6, 7}))
    assert search.candidates == [6, 7, 8]
    assert search.bounds == (5, 8)


def test_everything_unknown_reports_the_whole_range() -> None:
    search, probed = _bisect(6, 3, frozenset(range(1, 5)))
    assert sorted(probed) == [1, 2, 3, 4]
    assert search.candidates == [1, 2, 3, 4, 5]


def test_next_after_names_both_possible_next_midpoints() -> None:
    search = Search(130)
    mid = search.next_index()
    assert mid == 64
    assert search.next_after(64) == [32, 96]


def test_remaining_estimate_counts_down_to_zero() -> None:
    search = Search(130)
    assert search.remaining_estimate() == 8
    search.record(64, Answer.YES)
    assert search.remaining_estimate() == 6
    search, _ = _bisect(130, 5)
    assert search.remaining_estimate() == 0
