"""The one rule for "may this variant be ranked?" (analysis.validity) on hand-built summary.json
dicts: it fires for a truncated, failing or mostly gibberish variant with the numbers in its reason,
stays quiet for a clean one and for one gibberish request in ten, and a comparison against a base
that breaks it is not comparable either."""

from __future__ import annotations

from typing import Any

import pytest

from itlaudit.analysis.validity import (
    COMPARABLE,
    Validity,
    block_validity,
    comparison_validity,
    variant_validity,
)


def summary(
    findings: dict[str, int] | None = None, *, requests: int = 6, errors: int = 0, **extra: Any
) -> dict:
    return {
        "variants": {
            "K0": {"requests": 6, "errors": 0, "findings": {}},
            "K3": {"requests": requests, "errors": errors, "findings": findings or {}},
        },
        "run_findings": extra.get("run_findings", []),
    }


def common_cap(variant: str, cap: int, hits: int) -> dict[str, Any]:
    return {"code": "common_cap", "evidence": {"variant": variant, "cap": cap, "requests_at_cap": hits}}


def test_a_clean_variant_is_comparable() -> None:
    result = variant_validity(summary({"stop_reason_unexpected": 1}), "K3")
    assert result == COMPARABLE and result.comparable and result.reason is None and result.label == ""


def test_a_capped_variant_names_the_cap_in_its_reason() -> None:
    counts = {"truncated_below_max_tokens": 6, "min_tokens_violated": 6, "common_cap": 1}
    result = variant_validity(summary(counts, run_findings=[common_cap("K3", 128, 6)]), "K3")
    assert result == Validity(False, "6 of 6 requests capped at 128 tokens")
    assert result.label == "not comparable: 6 of 6 requests capped at 128 tokens"


@pytest.mark.parametrize("code", ["truncated_below_max_tokens", "ignore_eos_violated", "min_tokens_violated"])
def test_one_truncated_request_is_enough(code: str) -> None:
    assert variant_validity(summary({code: 1}), "K3") == Validity(False, "1 of 6 requests cut short")


def test_truncations_beyond_the_common_cap_are_counted_too() -> None:
    found = summary({"truncated_below_max_tokens": 5}, run_findings=[common_cap("K3", 128, 3)])
    assert variant_validity(found, "K3").reason == "5 of 6 requests cut short, 3 of them capped at 128 tokens"


def test_a_failed_request_is_enough() -> None:
    assert variant_validity(summary(errors=1), "K3") == Validity(False, "1 of 6 requests failed")


def test_gibberish_counts_only_on_most_requests() -> None:
    assert variant_validity(summary({"gibberish_suspected": 1}, requests=10), "K3").comparable
    assert variant_validity(summary({"gibberish_suspected": 5}, requests=10), "K3").comparable  # half
    assert variant_validity(summary({"gibberish_suspected": 6}, requests=10), "K3") == Validity(
        False, "6 of 10 requests look like gibberish"
    )


def test_every_reason_is_given_together() -> None:
    found = summary({"truncated_below_max_tokens": 2, "gibberish_suspected": 4}, errors=1)
    assert variant_validity(found, "K3").reason == (
        "2 of 6 requests cut short; 1 of 6 requests failed; 4 of 6 requests look like gibberish"
    )


def test_a_variant_without_requests_is_not_comparable() -> None:
    assert variant_validity(summary(), "K9") == Validity(False, "no requests recorded")
    assert not block_validity({"requests": 0, "errors": 0, "findings": {}}).comparable


def test_the_cap_of_another_variant_is_not_borrowed() -> None:
    found = summary({"truncated_below_max_tokens": 6}, run_findings=[common_cap("K0", 64, 6)])
    assert variant_validity(found, "K3").reason == "6 of 6 requests cut short"


def test_a_comparison_is_only_as_comparable_as_both_sides() -> None:
    capped = Validity(False, "6 of 6 requests capped at 128 tokens")
    assert comparison_validity(COMPARABLE, COMPARABLE, "K0") == COMPARABLE
    assert comparison_validity(capped, COMPARABLE, "K0") == capped
    assert comparison_validity(COMPARABLE, capped, "K0").label == (
        "not comparable: base K0: 6 of 6 requests capped at 128 tokens"
    )
    both = comparison_validity(Validity(False, "1 of 6 requests failed"), capped, "K0")
    assert both.reason == "1 of 6 requests failed; base K0: 6 of 6 requests capped at 128 tokens"
