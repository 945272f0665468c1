"""Which turns of a long chat the model still reads (dashboard.chat.window), without a model."""

from dashboard.chat.window import KEEP_AFTER_STEP, Sized, answer_room, choose, estimate


def _chat(turns: int, chars: int = 600) -> list[Sized]:
    messages = []
    for _ in range(turns):
        messages += [Sized("user", chars), Sized("assistant", chars, tokens=150)]
    return messages + [Sized("user", chars)]  # the new question


def test_a_chat_that_fits_is_sent_whole():
    window = choose(_chat(2), system_chars=100, n_ctx=8192)
    assert window.start == 0


def test_a_chat_that_outgrows_the_context_keeps_the_newest_turns_from_a_question():
    messages = _chat(40)
    window = choose(messages, system_chars=100, n_ctx=2048)
    assert 0 < window.start < len(messages) - 1
    assert messages[window.start].role == "user"
    assert window.estimated_tokens <= 2048 - answer_room(2048)


def test_the_window_moves_in_steps_so_consecutive_turns_share_a_prefix():
    messages, starts, start = _chat(10), [], 0
    for _ in range(30):  # thirty more turns, each keeping the window the turn before chose
        start = choose(messages, system_chars=100, n_ctx=2048, previous_start=start).start
        starts.append(start)
        messages = messages + [Sized("assistant", 600, tokens=150), Sized("user", 600)]
    moves = sum(1 for a, b in zip(starts, starts[1:], strict=False) if a != b)
    assert 0 < moves < len(starts) // 3, starts
    assert starts == sorted(starts)  # never back: older turns stay left out


def test_after_a_step_the_kept_turns_fill_at_most_the_step_target():
    messages = _chat(40)
    window = choose(messages, system_chars=0, n_ctx=4096)
    budget = 4096 - answer_room(4096)
    ratio = 600 / 150
    kept = sum(estimate(m, ratio) for m in messages[window.start :])
    assert kept <= budget * KEEP_AFTER_STEP


def test_a_single_question_too_long_for_the_context_is_still_sent_for_the_engine_to_refuse():
    messages = [*_chat(3), Sized("user", 100_000)]
    window = choose(messages, system_chars=0, n_ctx=2048)
    assert window.start == len(messages) - 1
