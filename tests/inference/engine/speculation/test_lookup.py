"""Prompt lookup: what followed the latest earlier occurrence of the sequence's last tokens."""

from inference.engine.speculation.lookup import TokenHistory, draft


def history(tokens: list[int]) -> TokenHistory:
    return TokenHistory(tokens, capacity=len(tokens) + 8)


def test_it_drafts_what_followed_the_latest_earlier_occurrence():
    # ... 7 8 9 [1 2 3] 4 5 ... 1 2 3 → 4 5 6 (the later occurrence wins)
    seq = [1, 2, 3, 10, 11, 12, 7, 8, 9, 1, 2, 3, 4, 5, 6, 20, 1, 2, 3]
    assert draft(history(seq), 3) == [4, 5, 6]


def test_a_longer_match_is_preferred_to_a_more_recent_shorter_one():
    seq = [5, 1, 2, 3, 40, 41, 9, 2, 3, 50, 51, 60, 5, 1, 2, 3]
    assert draft(history(seq), 2) == [40, 41]  # 4 tokens "5 1 2 3" beat "2 3" → 50 51


def test_nothing_when_the_tail_never_occurred_before_or_nothing_is_asked():
    assert draft(history([1, 2, 3, 4, 5]), 4) == []
    assert draft(history([1, 2, 1, 2]), 0) == []


def test_a_draft_stops_at_the_end_of_what_is_known():
    assert draft(history([7, 8, 9, 7, 8]), 5) == [9, 7, 8]


def test_the_history_grows_past_its_capacity():
    grown = TokenHistory([1, 2], capacity=2)
    for token in range(3, 40):
        grown.append(token)
    assert grown.length == 39 and grown.ids[38] == 39
