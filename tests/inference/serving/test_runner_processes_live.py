"""The live appliance's runner processes seen from outside: a runner killed under the real
`openai` and `ollama` clients' streams, a web process that never maps llama.cpp, and an unload
that gives the memory back."""

import os
import signal
import time

import httpx
import ollama
import psutil
import pytest
from openai import APIError, OpenAI

from tests.dashboard.api.server import STARTER, Appliance, prepare

pytestmark = pytest.mark.model

STORY = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]
RUNNER_MODULE = "inference.serving.runner_main"


@pytest.fixture(scope="module")
def live(tmp_path_factory, starter_path) -> Appliance:
    """A served appliance of its own (tests.dashboard.api.server), so its runners can be
    killed and its model unloaded without touching the API tests' one."""
    server = prepare(tmp_path_factory.mktemp("runner-processes"))
    server.start()
    yield server
    server.stop()


def runners(live: Appliance) -> list[psutil.Process]:
    """The runners holding a model (a spare runner waiting for a load is not one)."""
    found = live.runner_processes()
    assert all(RUNNER_MODULE in " ".join(child.cmdline()) for child in found)
    return found


def the_runner(live: Appliance) -> psutil.Process:
    (runner,) = runners(live)
    return runner


def openai_client(live: Appliance) -> OpenAI:
    return OpenAI(base_url=f"{live.url}/v1", api_key=live.keys["chat-app"], max_retries=0,
                  timeout=120)  # fmt: skip


def answer_once(live: Appliance) -> str:
    reply = openai_client(live).chat.completions.create(
        model=STARTER, messages=[{"role": "user", "content": "Name a colour."}], max_tokens=4
    )
    return reply.choices[0].message.content


def test_an_openai_stream_whose_runner_segfaults_ends_with_an_error_event(live):
    answer_once(live)
    stream = openai_client(live).chat.completions.create(
        model=STARTER, messages=STORY, max_tokens=400, temperature=0.8, stream=True
    )
    text, killed = "", None
    with pytest.raises(APIError) as raised:
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
            if len(text) > 10 and killed is None:
                os.kill(the_runner(live).pid, signal.SIGSEGV)
                killed = time.monotonic()
    assert time.monotonic() - killed < 3
    assert "killed by signal 11 (SIGSEGV) during decode" in str(raised.value)
    assert answer_once(live)  # the next request is served by a new runner


def test_an_ollama_stream_whose_runner_is_killed_ends_with_an_error_line(live):
    answer_once(live)
    client = ollama.Client(host=live.url, headers=live.headers("chat-app"), timeout=120)
    stream = client.chat(model=STARTER, messages=STORY, stream=True,
                         options={"num_predict": 400, "temperature": 0.8})  # fmt: skip
    pieces, killed = [], None
    with pytest.raises(ollama.ResponseError) as raised:
        for part in stream:
            pieces.append(part.message.content)
            if len(pieces) == 3:
                os.kill(the_runner(live).pid, signal.SIGKILL)
                killed = time.monotonic()
    assert time.monotonic() - killed < 3
    assert "killed by signal 9 (SIGKILL) during decode" in str(raised.value)
    assert answer_once(live)


def test_the_health_check_tells_the_runners_state_and_last_exit(live):
    answer_once(live)
    os.kill(the_runner(live).pid, signal.SIGSEGV)
    deadline = time.monotonic() + 3
    while True:
        health = httpx.get(f"{live.url}/healthz", timeout=10).json()
        rows = [r for w in health["workers"] for r in w["runners"] if r["model"] == STARTER]
        if rows[0]["state"] == "crashed" or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert rows[0]["state"] == "crashed"
    assert rows[0]["last_exit"] == "killed by signal 11 (SIGSEGV) while idle"
    assert STARTER not in health["unusable_models"]  # the next request restarts it


def test_the_web_process_never_maps_llama_cpp(live):
    answer_once(live)
    with open(f"/proc/{live.process.pid}/maps") as maps:
        assert "libllama" not in maps.read()
    with open(f"/proc/{the_runner(live).pid}/maps") as maps:
        assert "libllama" in maps.read()  # the check can see it where it is


def _unload(live: Appliance) -> None:
    response = httpx.post(f"{live.url}/api/generate", headers=live.headers("admin-app"),
                          json={"model": STARTER, "keep_alive": 0}, timeout=60)  # fmt: skip
    assert response.status_code == 200, response.text


def test_an_unload_ends_the_runner_and_gives_its_memory_back(live):
    web = psutil.Process(live.process.pid)
    _unload(live)
    assert runners(live) == []
    before = web.memory_info().rss
    answer_once(live)
    runner = the_runner(live)
    loaded_total = before + runner.memory_info().rss
    _unload(live)
    assert not runner.is_running() or runner.status() == psutil.STATUS_ZOMBIE
    assert runners(live) == []
    after = web.memory_info().rss
    assert after <= before * 1.10, (before, after)
    assert loaded_total > after  # what the runner held is gone with it
