from hypothesis import given, settings
from hypothesis import strategies as st

from inference.engine.textstream import TextStream


def feed_all(stream: TextStream, pieces: list[bytes]) -> list[str]:
    return [stream.feed(p) for p in pieces]


def test_plain_text_is_released_at_once():
    stream = TextStream()
    assert feed_all(stream, [b"Hel", b"lo"]) == ["Hel", "lo"]
    assert stream.flush() == ""
    assert stream.text == "Hello"


def test_a_character_split_across_two_tokens_is_never_emitted_half():
    stream = TextStream()
    e_acute = "é".encode()  # b"\xc3\xa9"
    assert stream.feed(b"caf" + e_acute[:1]) == "caf"
    assert stream.feed(e_acute[1:]) == "é"
    assert stream.text == "café"


def test_a_four_byte_character_split_over_four_tokens_comes_out_whole():
    stream = TextStream()
    out = feed_all(stream, [bytes([b]) for b in "🦙".encode()])
    assert out == ["", "", "", "🦙"]


def test_a_dangling_half_character_becomes_a_replacement_character_on_flush():
    stream = TextStream()
    assert stream.feed(b"ok\xc3") == "ok"
    assert stream.flush() == "\ufffd"


def test_a_stop_string_is_never_emitted_and_text_after_it_is_dropped():
    stream = TextStream(stop=("###",))
    out = feed_all(stream, [b"answer", b" #", b"## and", b" more"])
    assert "".join(out) == "answer "
    assert stream.stopped
    assert stream.flush() == ""
    assert stream.text == "answer "


def test_a_stop_string_inside_one_token_stops_at_once():
    stream = TextStream(stop=("END",))
    assert stream.feed(b"doneENDjunk") == "done"
    assert stream.stopped
    assert stream.feed(b"later") == ""


def test_a_partial_stop_prefix_is_held_then_released_when_it_is_not_a_stop():
    stream = TextStream(stop=("</s>",))
    assert stream.feed(b"a <") == "a "
    assert stream.feed(b"/") == ""
    assert stream.feed(b"b") == "</b"
    assert not stream.stopped
    assert stream.text == "a </b"


def test_flush_releases_held_text():
    stream = TextStream(stop=("\n\n",))
    assert stream.feed(b"line\n") == "line"
    assert stream.flush() == "\n"
    assert stream.text == "line\n"


def test_the_earliest_of_several_stop_strings_wins_when_both_complete():
    stream = TextStream(stop=("bb", "ab"))
    assert stream.feed(b"xa") == "x"
    assert stream.feed(b"bb") == ""  # "ab" starts before "bb": nothing of it may leak
    assert stream.stopped
    assert stream.text == "x"


def test_a_stop_string_split_over_a_multibyte_character_is_caught():
    stream = TextStream(stop=("é!",))
    e_acute = "é".encode()
    assert feed_all(stream, [b"hi ", e_acute[:1], e_acute[1:], b"!"]) == ["hi ", "", "", ""]
    assert stream.stopped
    assert stream.text == "hi "


@settings(max_examples=150, deadline=None, database=None)
@given(
    text=st.text(alphabet="ab#é🦙 ", max_size=40),
    stops=st.lists(st.text(alphabet="ab#é", min_size=1, max_size=4), min_size=1, max_size=3),
    cuts=st.lists(st.integers(0, 200), max_size=30),
)
def test_streamed_text_is_the_text_before_the_first_stop_however_the_bytes_are_cut(
    text, stops, cuts
):
    data = text.encode()
    bounds = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    pieces = [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    stream = TextStream(stop=tuple(stops))
    streamed = "".join(feed_all(stream, pieces)) + stream.flush()
    # The generation stops at the first piece after which some stop string has appeared, and
    # keeps only what comes before the earliest stop string seen by then.
    expected, stopped = text, False
    for end in bounds[1:]:
        seen = data[:end].decode("utf-8", errors="ignore")  # whole characters only
        hits = [seen.find(stop) for stop in stops if stop in seen]
        if hits:
            expected, stopped = seen[: min(hits)], True
            break
    assert streamed == expected == stream.text
    assert stream.stopped == stopped


def test_the_stop_string_that_ended_the_text_is_named():
    stream = TextStream(stop=("END", "st"))
    assert feed_all(stream, [b"fir", b"st END"]) == ["fir", ""]
    assert stream.stopped and stream.matched == "st"  # the earliest match, not the first listed
    assert stream.text == "fir"
    plain = TextStream(stop=("END",))
    feed_all(plain, [b"no stop here"])
    assert plain.flush() == "" and plain.matched is None
