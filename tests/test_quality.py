"""Text-quality figures and the gibberish_suspected finding on the kinds of text seed 003 describes."""

from __future__ import annotations

import dataclasses
import random
import time

import derive_long_output
import pytest

from itlaudit.analysis import quality
from itlaudit.analysis.derive import derive_request
from itlaudit.analysis.findings import Finding, request_findings
from itlaudit.analysis.metrics import request_metrics
from itlaudit.analysis.quality import (
    GibberishThresholds,
    gibberish_reasons,
    rep_n,
    text_quality,
    text_sha256,
    weird_runs,
)
from itlaudit.model.codes import GIBBERISH_SUSPECTED
from itlaudit.model.records import RequestParams, RequestRecord

CLEAN_EN = (
    "Stable long-context inference needs a regression test that looks at the text, not only at the "
    "speed. The test sends a fixed prompt, lets the model stop on its own, and compares the output "
    "against a baseline produced by a known good build. Background: a faster attention backend once "
    "replayed a captured decode graph with stale metadata; the tokens kept coming at full speed, but "
    "after a few hundred of them the document turned into noise. Problem definition: detect such drift "
    "automatically. Metrics: the share of digits, runs of punctuation, repeated numbers and n-gram "
    "repetition. Acceptance criteria: version 2 of the suite must flag every known bad build."
)
CLEAN_ZH = (
    "在 vLLM 中实现稳定的长上下文推理质量回归测试，需要同时关注输出文本本身，而不仅仅是速度。"
    "测试使用固定的提示词，让模型自然结束，并将输出与已知正常版本的基线进行比较。背景是某个更快的"
    "注意力后端在回放已捕获的解码图时读取了过期的元数据，生成速度不变，但几百个词元之后文档逐渐"
    "变成无意义的内容。问题定义是自动发现这种漂移。指标包括数字占比、标点连续片段、重复数字以及"
    "重复的短语片段。验收标准是测试套件必须能够标记每一个已知的坏版本，并且对正常版本不产生误报。"
) * 2
# What the bad runs drifted into: a fluent start, then dates and numbers.
GIBBERISH = (
    CLEAN_EN[:300]
    + " 2026-06-15 2026-06-15 12:30:45, 2026-06-16 00:00:00; 1024 1024 1024 3.1415926 "
    + "20260615 20260615 20260615 2026/06/15 - 12:00:00 | 0.0195 0.1286 0.5925 ... 7777777 "
    + "2026-06-15T12:30:45Z 2026-06-15T12:30:46Z 99.99% 100.00% 00000000 1111 2222 3333 4444 "
)


@pytest.mark.parametrize("text", [CLEAN_EN, CLEAN_ZH], ids=["english", "chinese"])
def test_clean_prose_is_on_the_clean_side(text: str) -> None:
    quality = text_quality(text)
    assert quality.digit_ratio <= 0.02  # the seed's clean population
    assert quality.weird_runs == 0
    assert quality.repeated_num_runs == 0
    assert gibberish_reasons(quality) == []


def test_numeric_date_gibberish_is_on_the_bad_side() -> None:
    quality = text_quality(GIBBERISH)
    assert 0.13 <= quality.digit_ratio <= 0.59  # the seed's bad population
    assert quality.weird_runs >= 3
    assert quality.repeated_num_runs >= 2  # "1024 1024 1024", "20260615 ×3"
    assert quality.max_digit_run == 8
    reasons = gibberish_reasons(quality)
    assert any(r.startswith("digit_ratio") for r in reasons)
    assert any(r.startswith("weird_runs") for r in reasons)


def test_thresholds_are_configurable() -> None:
    quality = text_quality(GIBBERISH)
    lenient = GibberishThresholds(max_digit_ratio=0.9, max_weird_runs=100, max_repeated_num_runs=100)
    assert gibberish_reasons(quality, lenient) == []
    assert gibberish_reasons(text_quality(CLEAN_EN), GibberishThresholds(max_digit_ratio=0.0)) != []


def test_short_outputs_are_not_judged() -> None:
    assert gibberish_reasons(text_quality("2026-06-15 12:30:45 2026-06-16")) == []


def test_weird_runs_need_digits_not_just_punctuation() -> None:
    assert weird_runs("| a | b |\n|---|---|---|---|\n") == 0
    assert weird_runs("see 2026-06-15 12:30:45 and 1.2.3.4.5.6.7 end") == 2


def test_rep_n_and_compression_tell_a_loop_from_prose() -> None:
    loop = "the model the model the model the model the model the model " * 10
    assert rep_n(["a", "b", "c", "d"], 2) == 0.0
    assert rep_n(["a", "b"] * 3, 2) == pytest.approx(1 - 2 / 5)
    looped, prose = text_quality(loop), text_quality(CLEAN_EN)
    assert looped.rep_4 > 0.9 > prose.rep_4
    assert looped.compression_ratio > 3 * prose.compression_ratio
    assert prose.text_sha256 == text_sha256(CLEAN_EN)


def _record(text: str, ignore_eos: bool = False) -> RequestRecord:
    return RequestRecord(
        request_id="K0-00000",
        variant="K0",
        endpoint="completions",
        url="http://x/v1/completions",
        model="m",
        params=RequestParams(max_tokens=1024, ignore_eos=ignore_eos),
        text=text,
        finish_reason="stop",
        done_sentinel=True,
    )


def _codes(record: RequestRecord, **kwargs: object) -> list[str]:
    return [f.code for f in request_findings(record, request_metrics(record), **kwargs)]  # type: ignore[arg-type]


def _gibberish_finding(record: RequestRecord) -> Finding:
    found = request_findings(record, request_metrics(record))
    (finding,) = [f for f in found if f.code == GIBBERISH_SUSPECTED]
    return finding


def test_gibberish_finding_fires_on_numeric_drift() -> None:
    finding = _gibberish_finding(_record(GIBBERISH))
    assert finding.evidence["digit_ratio"] > 0.35
    assert finding.evidence["thresholds"]["max_digit_ratio"] == 0.35
    assert "ignore_eos" not in finding.message


def test_gibberish_in_the_reasoning_channel_is_gibberish_too() -> None:
    """A thinking model's digit soup in its reasoning channel, before a clean answer: the text audits
    read everything the model wrote (RequestRecord.output), not the answer alone; a clean thought
    and a clean answer stay quiet."""
    thought = dataclasses.replace(_record(CLEAN_EN), reasoning=GIBBERISH)
    assert GIBBERISH_SUSPECTED not in _codes(_record(CLEAN_EN))  # the answer alone is clean
    assert _gibberish_finding(thought).code == GIBBERISH_SUSPECTED
    assert GIBBERISH_SUSPECTED not in _codes(dataclasses.replace(_record(CLEAN_EN), reasoning=CLEAN_EN))


def test_gibberish_finding_under_ignore_eos_asks_for_natural_eos() -> None:
    finding = _gibberish_finding(_record(GIBBERISH, ignore_eos=True))
    assert "natural EOS" in finding.message
    assert finding.evidence["ignore_eos"] is True


@pytest.mark.parametrize("text", [CLEAN_EN, CLEAN_ZH, ""], ids=["english", "chinese", "empty"])
def test_gibberish_finding_stays_quiet_on_clean_text(text: str) -> None:
    assert GIBBERISH_SUSPECTED not in _codes(_record(text))


def test_gibberish_finding_follows_custom_thresholds() -> None:
    lenient = GibberishThresholds(max_digit_ratio=0.9, max_weird_runs=100, max_repeated_num_runs=100)
    assert GIBBERISH_SUSPECTED not in _codes(_record(GIBBERISH), quality=lenient)


def test_derived_figures_carry_quality_fields() -> None:
    line = derive_request(_record(GIBBERISH))
    for key in ("digit_ratio", "weird_runs", "repeated_num_runs", "max_digit_run", "rep_2", "rep_3", "rep_4"):
        assert key in line
    assert line["text_sha256"] == text_sha256(GIBBERISH)
    assert GIBBERISH_SUSPECTED in line["findings"]


# --- fault row N20: linear, bounded derivation, the same figures as the per-character rules -------


def test_run_and_space_classes_cover_all_of_unicode() -> None:
    """The classes are built from planes 0-1 (spaces from the BMP): nothing past them may qualify."""
    beyond = [chr(c) for c in range(0x20000, 0x110000) if quality._is_run_char(chr(c)) or chr(c).isdigit()]
    assert beyond == []
    assert [chr(c) for c in range(0x10000, 0x110000) if chr(c).isspace()] == []


def _varied_texts() -> list[str]:
    """Prose, digits, punctuation, symbols, odd spaces, superscripts, CJK and emoji, mixed at random
    (numbers always set apart, so that 'the same number three times' means whole numbers)."""
    rng = random.Random(23)
    pieces = [
        "word", "the", "model", "1024", "2026-06-15", "12:30:45", "3.1415", "²³", "¹⁰", "-", "|", "...",
        "—", "“", "€", "🚀", "🎉", "推理", "质量", "，", "。", "\u00a0", "\u3000", "\t", "\n", "_x_", "ⅷ",
        "𝟘𝟙", "①", "a1b2", "--|--", "$", "%", "0000", "7",
    ]  # fmt: skip
    texts = [CLEAN_EN, CLEAN_ZH, GIBBERISH, "", " ", "1024 1024 1024", "x" * 50, "1" * 5000]
    for _ in range(60):
        texts.append(" ".join(rng.choice(pieces) for _ in range(rng.randint(1, 400))))
    return texts


def test_figures_equal_the_per_character_implementation_on_varied_texts() -> None:
    """The old rules (quality.py before the rewrite, read from git by the benchmark) as the oracle."""
    old = derive_long_output.old_quality()
    old._is_run_char = quality._is_run_char  # the one change of definition since: a run stays in its line
    for text in _varied_texts():
        assert text_quality(text).to_json() == old.text_quality(text).to_json(), repr(text[:80])


def test_a_weird_run_stays_within_its_line() -> None:
    """A timeline's line break between numbers is layout, not a digit stream (real text, issue 25)."""
    assert weird_runs("first flight (1961)\n1963: landing") == 0
    assert weird_runs("first flight (1961) 1963: landing") == 1


def test_a_number_is_a_whole_digit_run() -> None:
    """The one intended difference from the old regex, which took a suffix of a longer run as the number."""
    assert text_quality("1024 1024 1024").repeated_num_runs == 1
    assert text_quality("51024 1024 1024").repeated_num_runs == 0


@pytest.mark.parametrize("text", ["7" * 300_000, "1, " * 100_000, "2026-06-15 " * 30_000, "a" * 300_000])
def test_pathological_long_runs_derive_in_linear_time(text: str) -> None:
    """A long digit run was quadratic in the repeated-number regex; a long punctuation run a list of
    every character. Each of these took the old rules from seconds to hours."""
    started = time.perf_counter()
    text_quality.__wrapped__(text)
    assert time.perf_counter() - started < 5.0
