"""Warm memory in the live appliance, with the real model and real processes: a prompt the box
has read stays read across an unload, a restart on the same data directory and a killed runner,
and comes back as the same answer."""

import os
import signal
import time

import httpx
import psutil
import pytest

from tests.dashboard.api.ha_home import INSTRUCTIONS, entities
from tests.dashboard.api.server import STARTER, Appliance, prepare

pytestmark = pytest.mark.model

# Home Assistant's instructions and part of a home's entities: ~700 tokens of the starter model.
SYSTEM = INSTRUCTIONS + "\n" + entities()[:2200]


@pytest.fixture(scope="module")
def live(tmp_path_factory) -> Appliance:
    server = prepare(tmp_path_factory.mktemp("kept-prompts"))
    server.start(RELOAD_MODELS_AT_START="true")
    yield server
    server.stop()


def ask(live: Appliance, command: str, system: str = SYSTEM) -> dict:
    """A non-streamed chat answer, greedy, with its usage and llama-server-style timings."""
    response = httpx.post(f"{live.url}/v1/chat/completions", headers=live.headers("chat-app"),
                          json={"model": STARTER, "max_tokens": 12, "temperature": 0,
                                "messages": [{"role": "system", "content": system},
                                             {"role": "user", "content": command}]},
                          timeout=300)  # fmt: skip
    assert response.status_code == 200, response.text
    return response.json()


def cached(reply: dict) -> int:
    return reply["usage"]["prompt_tokens_details"]["cached_tokens"]


def loaded_models(live: Appliance) -> list[str]:
    ps = httpx.get(f"{live.url}/api/ps", headers=live.headers("chat-app"), timeout=10).json()
    return [row["name"].removesuffix(":latest") for row in ps["models"]]


def unload(live: Appliance) -> None:
    response = httpx.post(f"{live.url}/api/generate", headers=live.headers("manage-app"),
                          json={"model": STARTER, "keep_alive": 0}, timeout=60)  # fmt: skip
    assert response.status_code == 200, response.text
    deadline = time.monotonic() + 20
    while loaded_models(live) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not loaded_models(live)


def the_runner(live: Appliance) -> psutil.Process:
    (runner,) = live.runner_processes()
    return runner


def test_a_prompt_read_before_an_unload_is_not_read_again(live):
    first = ask(live, "Turn on the kitchen lamp.")
    assert first["usage"]["prompt_tokens"] > 500
    unload(live)
    after = ask(live, "Is the garage fan on?")
    assert cached(after) >= first["usage"]["prompt_tokens"] - 40  # the system prompt, from disk
    assert after["timings"]["cache_n"] == cached(after)
    assert after["timings"]["load_ms"] > 0  # it did load: the prompt came back all the same


def test_a_restart_on_the_same_data_directory_comes_back_loaded_and_warm(live):
    ask(live, "Close the bedroom blinds.")
    live.stop()
    live.start(RELOAD_MODELS_AT_START="true")
    deadline = time.monotonic() + 60
    while STARTER not in loaded_models(live) and time.monotonic() < deadline:
        time.sleep(0.2)  # no request has come: the model loads by itself
    assert STARTER in loaded_models(live)
    after = ask(live, "What is the temperature in the office?")
    assert not after["timings"]["load_ms"]  # found loaded
    assert cached(after) > 500


def test_a_killed_runner_loses_only_what_it_held_in_ram_and_answers_the_same(live):
    other = "You answer questions about gardening in one sentence. " * 12
    before = ask(live, "When do tulips flower?", system=other)
    ask(live, "Pause the speaker in the living room.")
    runner = the_runner(live)
    os.kill(runner.pid, signal.SIGKILL)
    runner.wait(10)
    again = ask(live, "When do tulips flower?", system=other)
    assert again["choices"][0]["message"]["content"] == before["choices"][0]["message"]["content"]
    warm = ask(live, "Set the guest room to 19 degrees.")  # its prompt was on disk already
    assert cached(warm) > 500
