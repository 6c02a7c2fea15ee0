"""SSE framing against the WHATWG rules and against real vLLM captures split at arbitrary points.

The parser sees whatever TCP hands over, so every rule is also checked with the input cut into
pieces: a result that depends on where reads happen to split would make timing records wrong.
"""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

from itlaudit.capture.sse import SSEFramer

FIXTURES = Path(__file__).parent / "fixtures" / "vllm-0.24.0-cuda"
CAPTURES = sorted(FIXTURES.glob("*.sse"))


def feed_pieces(pieces: list[bytes]) -> list[bytes]:
    parser = SSEFramer()
    events: list[bytes] = []
    for piece in pieces:
        events.extend(parser.feed(piece))
    return events


def feed_whole(stream: bytes) -> list[bytes]:
    return SSEFramer().feed(stream)


def split_at(stream: bytes, offsets: list[int]) -> list[bytes]:
    bounds = [0, *sorted(offsets), len(stream)]
    return [stream[a:b] for a, b in itertools.pairwise(bounds)]


def data_of(events: list[bytes]) -> list[str]:
    return [e.decode() for e in events]


# --- line endings ---------------------------------------------------------------------------------


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"])
def test_each_line_ending_delimits_lines_and_events(eol: bytes) -> None:
    stream = b"data: a" + eol + b"data: b" + eol + eol + b"data: c" + eol + eol
    assert data_of(feed_whole(stream)) == ["a\nb", "c"]
    assert data_of(feed_pieces([bytes([b]) for b in stream])) == ["a\nb", "c"]


def test_mixed_line_endings_in_one_stream() -> None:
    assert data_of(feed_whole(b"data: a\r\ndata: b\rdata: c\n\r\n")) == ["a\nb\nc"]


def test_crlf_split_across_feeds_is_one_line_ending() -> None:
    # Were the LF taken as a second line ending it would be a blank line and dispatch "a" alone.
    assert data_of(feed_pieces([b"data: a\r", b"\ndata: b\r\n\r\n"])) == ["a\nb"]
    assert data_of(feed_pieces([b"data: a\r", b"\n", b"\r\n"])) == ["a"]


def test_crlf_split_survives_an_empty_feed_in_between() -> None:
    assert data_of(feed_pieces([b"data: a\r", b"", b"\ndata: b\n\n"])) == ["a\nb"]


def test_lone_cr_at_piece_end_followed_by_cr_is_a_blank_line() -> None:
    assert data_of(feed_pieces([b"data: a\r", b"\r"])) == ["a"]


def test_lf_after_cr_is_only_swallowed_directly_after_it() -> None:
    assert data_of(feed_pieces([b"data: a\r", b"data: b\n", b"\n"])) == ["a\nb"]


# --- fields ---------------------------------------------------------------------------------------


def test_comments_are_ignored() -> None:
    assert data_of(feed_whole(b": keep-alive\n:\ndata: x\n: mid-event comment\n\n")) == ["x"]


def test_comment_alone_dispatches_nothing() -> None:
    assert feed_whole(b": ping\n\n") == []


def test_only_one_leading_space_is_stripped() -> None:
    assert data_of(feed_whole(b"data:x\n\ndata:  y\n\ndata: \tz \n\n")) == ["x", " y", "\tz "]


def test_value_may_contain_colons() -> None:
    assert data_of(feed_whole(b'data: {"a": "b:c"}\n\n')) == ['{"a": "b:c"}']


def test_line_without_colon_is_field_with_empty_value() -> None:
    assert feed_whole(b"data\n\n") == [b""]
    assert data_of(feed_whole(b"data: a\ndata\n\n")) == ["a\n"]


def test_unknown_fields_are_ignored() -> None:
    assert data_of(feed_whole(b"foo: bar\nDATA: shout\ndata: x\n\n")) == ["x"]


def test_multiple_data_lines_join_with_newline() -> None:
    assert data_of(feed_whole(b"data: a\ndata: b\ndata:\ndata: c\n\n")) == ["a\nb\n\nc"]


def test_other_fields_are_parsed_past() -> None:
    assert data_of(feed_whole(b"event: update\nid: 7\nretry: 10\ndata: 1\n\ndata: 2\n\n")) == ["1", "2"]


def test_event_with_empty_data_buffer_is_not_dispatched() -> None:
    assert feed_whole(b"event: x\nid: 3\n\n\n\n") == []


def test_empty_data_line_is_still_dispatched() -> None:
    assert feed_whole(b"data:\n\n") == [b""]


def test_event_unfinished_at_stream_end_is_not_dispatched() -> None:
    assert feed_pieces([b"data: a\n\ndata: b\n", b"data: c"]) == [b"a"]


def test_events_are_returned_by_the_feed_that_completes_them() -> None:
    parser = SSEFramer()
    assert parser.feed(b"data: a\n") == []
    completed = parser.feed(b"\ndata: b\n\ndata: c\n\nda")
    assert completed == [b"a", b"b", b"c"]
    assert parser.feed(b"ta: d\n") == []
    assert parser.feed(b"\n") == [b"d"]


def test_long_line_arriving_in_many_pieces() -> None:
    payload = b"x" * 10_000
    pieces = [b"data: ", *[payload[i : i + 7] for i in range(0, len(payload), 7)], b"\n\n"]
    assert data_of(feed_pieces(pieces)) == [payload.decode()]


# --- UTF-8 and BOM --------------------------------------------------------------------------------


@pytest.mark.parametrize("char", ["é", "€", "😀"])
def test_multibyte_character_split_at_every_offset(char: str) -> None:
    stream = f"data: a{char}b\n\n".encode()
    start = len(b"data: a")
    for cut in range(start, start + len(char.encode()) + 1):
        assert data_of(feed_pieces([stream[:cut], stream[cut:]])) == [f"a{char}b"], cut
    assert data_of(feed_pieces([bytes([b]) for b in stream])) == [f"a{char}b"]


def test_every_pair_of_cuts_through_multibyte_event_type_and_data() -> None:
    stream = "event: 😀\ndata: 😀é\n\n".encode()
    for first in range(len(stream)):
        for second in range(first, len(stream)):
            events = feed_pieces(split_at(stream, [first, second]))
            assert data_of(events) == ["😀é"], (first, second)


def test_invalid_utf8_passes_through_as_bytes() -> None:
    # Framing never decodes: the JSON decoder sees the bytes as sent and reports them.
    assert feed_whole(b"data: a\xffb\n\n") == [b"a\xffb"]
    assert feed_whole(b"data: a\xf0\x9f\n\n") == [b"a\xf0\x9f"]


def test_leading_bom_is_stripped() -> None:
    assert data_of(feed_whole(b"\xef\xbb\xbfdata: x\n\n")) == ["x"]


def test_bom_split_across_feeds_is_stripped() -> None:
    stream = b"\xef\xbb\xbfdata: x\n\n"
    for cut in range(len(stream) + 1):
        assert data_of(feed_pieces([stream[:cut], stream[cut:]])) == ["x"], cut
    assert data_of(feed_pieces([b"", b"\xef", b"\xbb", b"\xbf", b"data: x\n\n"])) == ["x"]


def test_only_the_first_bom_is_stripped() -> None:
    # The second BOM becomes part of the field name, so that line is an unknown field.
    assert feed_whole(b"\xef\xbb\xbf\xef\xbb\xbfdata: x\n\n") == []
    assert data_of(feed_whole(b"data: a\n\n\xef\xbb\xbfdata: b\n\ndata: c\n\n")) == ["a", "c"]


def test_bytes_held_back_as_a_possible_bom_are_not_lost() -> None:
    parser = SSEFramer()
    assert parser.feed(b"\xef\xbb") == []
    assert parser.feed(b"\ndata: x\n\n") == [b"x"]


# --- real vLLM captures ---------------------------------------------------------------------------


def reference_events(stream: bytes) -> list[str]:
    """The captures use LF only and one data line per event, so a plain split is a valid oracle."""
    blocks = stream.decode("utf-8").split("\n\n")
    assert blocks[-1] == ""
    assert all(block.startswith("data: ") and "\n" not in block for block in blocks[:-1])
    return [block[len("data: ") :] for block in blocks[:-1]]


def test_fixture_files_are_present() -> None:
    assert [p.name for p in CAPTURES] == [
        "chat-k0.sse",
        "chat-k3.sse",
        "completions-k0-token-ids.sse",
        "completions-k3-token-ids.sse",
    ]


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda p: p.name)
def test_capture_whole_matches_reference(capture: Path) -> None:
    stream = capture.read_bytes()
    events = feed_whole(stream)
    expected_count = {"chat-k0.sse": 18, "chat-k3.sse": 19}.get(capture.name, 18)
    assert len(events) == expected_count
    assert data_of(events) == reference_events(stream)
    assert events[-1] == b"[DONE]"


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda p: p.name)
def test_capture_split_at_every_single_point(capture: Path) -> None:
    stream = capture.read_bytes()
    whole = feed_whole(stream)
    for cut in range(len(stream) + 1):
        assert feed_pieces([stream[:cut], stream[cut:]]) == whole, cut


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda p: p.name)
def test_capture_byte_by_byte(capture: Path) -> None:
    stream = capture.read_bytes()
    assert feed_pieces([bytes([b]) for b in stream]) == feed_whole(stream)


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda p: p.name)
@pytest.mark.parametrize("eol", [b"\r\n", b"\r"])
def test_capture_with_other_line_endings_random_splits(capture: Path, eol: bytes) -> None:
    original = capture.read_bytes()
    stream = original.replace(b"\n", eol)
    whole = feed_whole(original)
    rng = random.Random(f"{capture.name}{eol!r}")
    for _ in range(200):
        cuts = rng.sample(range(len(stream) + 1), rng.randint(1, 40))
        assert feed_pieces(split_at(stream, cuts)) == whole, cuts


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda p: p.name)
def test_capture_random_splits(capture: Path) -> None:
    stream = capture.read_bytes()
    whole = feed_whole(stream)
    rng = random.Random(capture.name)
    for _ in range(300):
        cuts = rng.sample(range(len(stream) + 1), rng.randint(1, 200))
        assert feed_pieces(split_at(stream, cuts)) == whole, cuts
