"""The vision benchmark's CPU side (bench/vision.py): what it sends and how canned figures
become issue 29's goals. No server runs here."""

import base64
import struct

import pytest

from bench.vision import big_image, corrupt_image, frame, goals, options, summarize


def reply(text: str, prompt_tokens: int, cached: int = 0) -> dict:
    return {"status": 200, "text": text, "prompt_tokens": prompt_tokens, "cached": cached}


def stall(p99: float, frames_per_minute: float) -> dict:
    return {"person_itl_p50_s": 0.03, "person_itl_p99_s": p99, "person_itl_max_s": p99 * 1.2,
            "person_ttft_p50_s": 0.2, "frames_per_minute": frames_per_minute,
            "frame_errors": 0}  # fmt: skip


def bad(status: int | None, next_status: int | None) -> dict:
    return {"status": status, "next_status": next_status, "said": "", "bytes": 1}


def test_the_figures_become_the_issues_goals():
    rows = {
        "appliance": {
            "answers": {"one_image_after_text": reply("A cat.", 95),
                        "two_images_before_text": reply("Two dogs.", 160)},
            "cache": {"second_turn": reply("Blue.", 120, cached=110),
                      "new_question": reply("Day.", 95, cached=70)},
            "bad": {"corrupt": bad(400, 200), "url": bad(400, 200), "big": bad(413, 200)},
            "stall": [stall(0.12, 30.0), stall(0.14, 34.0)],
        },
        "llama-server": {
            "answers": {"one_image_after_text": reply("A cat.", 95),
                        "two_images_before_text": reply("Two dogs!", 160)},
            "cache": {"second_turn": reply("Blue.", 120, cached=100)},
            "bad": {"corrupt": bad(400, 200), "url": bad(500, 200), "big": bad(200, 200)},
            "stall": [stall(1.4, 40.0), stall(1.3, 40.0)],
        },
    }  # fmt: skip
    results = summarize(rows)
    assert results["second_turn_cached_share"] == 110 / 120
    assert results["person_itl_p99_s"] == pytest.approx(0.13) and results["frames_ratio"] == 0.8
    assert results["bad_input_refused_and_next_answered_llama_server"] is False
    verdicts = {row["figure"]: row["met"] for row in goals(results)}
    assert verdicts == {
        "answers_one_image_after_text_match": True,
        "answers_two_images_before_text_match": False,
        "second_turn_cached_share": True, "bad_input_refused_and_next_answered": True,
        "person_itl_p99_s": True, "frames_ratio": True,
    }  # fmt: skip


def test_a_refusal_without_an_answer_or_a_good_request_lost_after_it_misses_the_goal():
    for corrupt in (bad(None, 200), bad(400, 500)):
        rows = {"appliance": {"bad": {"corrupt": corrupt, "url": bad(400, 200)}}}
        assert summarize(rows)["bad_input_refused_and_next_answered"] is False


def test_a_goal_whose_scenario_did_not_run_is_not_measured_rather_than_missed():
    results = summarize({"llama-server": {"stall": [stall(1.4, 40.0)]}})
    verdicts = {row["figure"]: row for row in goals(results)}
    assert verdicts["frames_ratio"]["met"] is None
    assert verdicts["person_itl_p99_s"]["value"] is None
    assert results["person_itl_p99_s_llama_server"] == 1.4


def test_quick_is_one_short_round_and_the_lists_are_checked():
    args = options(["--quick", "--sides", "llama-server", "--only", "answers,stall",
                    "--frame-size", "640x360"])  # fmt: skip
    assert (args.rounds, args.duration, args.sides) == (1, 15.0, ["llama-server"])
    assert args.only == ["answers", "stall"] and args.frame_size == (640, 360)


def test_each_frame_is_a_new_picture_and_the_bad_images_are_bad_in_one_way():
    assert frame(1, (64, 48)) != frame(2, (64, 48))
    assert frame(1, (64, 48)).startswith("data:image/png;base64,")
    corrupt = base64.b64decode(corrupt_image().split(",", 1)[1])
    assert corrupt.startswith(b"\x89PNG") and b"IHDR" not in corrupt[:16]
    big = base64.b64decode(big_image().split(",", 1)[1])
    magic, size, _, _, offset = struct.unpack("<2sIHHI", big[:14])
    width, height = struct.unpack("<ii", big[18:26])
    assert magic == b"BM" and size == len(big) >= 30 << 20
    assert len(big) == offset + width * height * 3 and width % 4 == 0
