"""Runner processes under supervision: real child processes, killed for real, with a fake
runner inside (tests.inference.serving.runner_factories) so that each test takes a second."""

import json
import os
import signal
import time

import pytest

from inference.engine import EngineStopped, PromptTooLong, RefusalKind, Refused, SamplingParams
from inference.engine.host import EngineHost, ModelSpec
from inference.engine.runner_config import RunnerConfig
from inference.serving.cpu_check import FILE_NAME, CpuCheck
from inference.serving.runner_process import RunnerLoadError, RunnerProcess
from inference.serving.supervisor import RunnerBackoff, RunnerSupervisor
from tests.inference.engine.fakes import ask, wait_until

FACTORIES = "tests.inference.serving.runner_factories"
DEATH_DEADLINE_S = 3.0  # the promise: a dead runner's requests end within 3 s


def supervisor(tmp_path, factory: str = "fake", **kwargs) -> RunnerSupervisor:
    return RunnerSupervisor(
        state_dir=tmp_path, runner_factory=f"{FACTORIES}:{factory}", **kwargs
    )


def spec(name: str = "m", **config) -> ModelSpec:
    return ModelSpec(name, RunnerConfig(model_path="/unused/by/the/fake.gguf", **config), -1)


@pytest.fixture
def runners():
    started = []
    yield started
    for process in started:
        process.shutdown(timeout=2)


def start(sup: RunnerSupervisor, runners: list, model: ModelSpec | None = None):
    process = sup.start(model or spec())
    runners.append(process)
    return process


def answer(process, prompt: str = "hello", max_tokens: int = 5):
    handle = process.submit(ask(prompt, SamplingParams(temperature=0, max_tokens=max_tokens)))
    return list(handle.events(timeout=10))


def state(sup: RunnerSupervisor, model: str = "m") -> dict:
    (row,) = [r for r in sup.states() if r["model"] == model]
    return row


# --- serving -----------------------------------------------------------------------------------


def test_a_runner_answers_with_the_engines_events(tmp_path, runners):
    process = start(supervisor(tmp_path), runners)
    events = answer(process, max_tokens=5)
    answer_events = [e.type for e in events if e.type not in ("phase", "progress")]
    assert answer_events == ["token"] * 5 + ["done"]
    assert any(e.type == "progress" for e in events)  # prefill progress crossed too
    assert events[-1].text == "".join(e.text for e in events if e.type == "token")
    assert process.pid != os.getpid()
    assert process.answered == 1 and not process.busy


def test_a_refusal_in_the_runner_is_raised_here(tmp_path, runners):
    process = start(supervisor(tmp_path), runners)
    with pytest.raises(Refused, match="per sequence") as refused:
        process.submit(ask("x" * 600, SamplingParams(max_tokens=1)))
    assert refused.value.kind == PromptTooLong.kind == RefusalKind.TOO_LONG
    assert answer(process)[-1].type == "done"  # and the runner goes on serving


def test_the_runner_sends_its_engine_snapshot(tmp_path, runners):
    process = start(supervisor(tmp_path), runners)
    answer(process)
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and process.snapshot().get("requests_total", 0) < 1:
        time.sleep(0.05)
    snapshot = process.snapshot()
    assert snapshot["name"] == "m"
    assert snapshot["slots"] == 4


# --- a runner that dies -----------------------------------------------------------------------


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSEGV])
def test_a_runner_killed_mid_stream_ends_its_requests_with_the_reason(how, tmp_path, runners):
    sup = supervisor(tmp_path)
    process = start(sup, runners)
    handles = [
        process.submit(ask(f"story {i}", SamplingParams(temperature=0, max_tokens=400)))
        for i in range(2)
    ]
    tokens = 0
    for event in handles[0].events(timeout=10):
        tokens += event.type == "token"
        if tokens == 3:
            break
    os.kill(process.pid, how)
    killed = time.monotonic()
    finals = [handle.result(timeout=DEATH_DEADLINE_S) for handle in handles]
    assert time.monotonic() - killed < DEATH_DEADLINE_S
    name = signal.Signals(how).name
    for final in finals:
        assert final.type == "error"
        assert f"killed by signal {int(how)} ({name}) during decode" in final.message
        assert "the answer so far is kept" in final.message
    row = state(sup)
    assert row["state"] == "crashed"
    assert row["last_exit"] == f"killed by signal {int(how)} ({name}) during decode"
    assert row["pid"] is None
    with pytest.raises(EngineStopped, match="was killed by signal"):
        process.submit(ask("after", SamplingParams(max_tokens=1)))


def test_the_host_starts_a_new_runner_for_the_next_request(tmp_path, runners):
    sup = supervisor(tmp_path)
    host = EngineHost(engine_factory=sup.start, max_loaded=1)
    try:
        first = host.submit(spec(), ask("hello", SamplingParams(max_tokens=3)))
        assert first.result(timeout=10).type == "done"
        old_pid = state(sup)["pid"]
        os.kill(old_pid, signal.SIGKILL)
        deadline = time.monotonic() + DEATH_DEADLINE_S
        while time.monotonic() < deadline and state(sup)["state"] != "crashed":
            time.sleep(0.02)

        again = host.submit(spec(), ask("hello", SamplingParams(max_tokens=3)))
        assert again.result(timeout=10).type == "done"
        row = state(sup)
        assert row["state"] == "running" and row["pid"] not in (None, old_pid)
        assert row["restarts"] == 1
        assert [r["name"] for r in host.loaded()] == ["m"]
    finally:
        host.shutdown()


def test_an_unload_ends_the_process_and_is_not_a_crash(tmp_path, runners):
    sup = supervisor(tmp_path)
    host = EngineHost(engine_factory=sup.start, max_loaded=1)
    host.load(spec())
    pid = state(sup)["pid"]
    assert host.unload("m")
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    row = state(sup)
    assert row["state"] == "stopped" and row["last_exit"] is None and row["restarts"] == 0


def test_a_runner_whose_supervisor_dies_stops_too(tmp_path):
    """No orphan keeps a model's memory: the runner ends when its connection closes."""
    import subprocess
    import sys

    script = (
        "import sys, time\n"
        "from inference.serving.supervisor import RunnerSupervisor\n"
        "from inference.engine.host import ModelSpec\n"
        "from inference.engine.runner_config import RunnerConfig\n"
        f"sup = RunnerSupervisor(runner_factory='{FACTORIES}:fake')\n"
        "p = sup.start(ModelSpec('m', RunnerConfig(model_path='/x.gguf'), -1))\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    runner_pid = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(runner_pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(runner_pid, signal.SIGKILL)
    pytest.fail("the runner outlived its supervisor")


# --- loads that fail ----------------------------------------------------------------------------


def test_a_clean_load_failure_is_a_load_error_with_llama_cpps_words(tmp_path):
    sup = supervisor(tmp_path, "refuses")
    with pytest.raises(RunnerLoadError, match="could not load the model"):
        sup.start(spec())
    row = state(sup)
    assert row["state"] == "failed"
    assert "could not load the model" in row["last_exit"]


def test_a_runner_that_segfaults_at_load_is_retried_once_without_extra_buffer_types(
    tmp_path, runners
):
    sup = supervisor(tmp_path, "segfaults_with_extra_bufts")
    process = start(sup, runners)
    assert process.config.use_extra_bufts is False
    assert answer(process)[-1].type == "done"
    row = state(sup)
    assert row["state"] == "running" and row["extra_bufts"] is False
    assert "CPU self-check" in row["note"] and "signal 11 (SIGSEGV) during load" in row["note"]
    # The verdict is kept for this host in the data dir ...
    saved = json.loads((tmp_path / FILE_NAME).read_text())
    assert saved[CpuCheck(tmp_path).fingerprint]["extra_bufts"] is False
    # ... so the next supervisor (a restarted appliance) starts safe at once: one try, no crash.
    again = supervisor(tmp_path, "segfaults_with_extra_bufts")
    second = start(again, runners, spec("other"))
    assert second.config.use_extra_bufts is False
    assert state(again, "other")["restarts"] == 0 and state(again, "other")["last_exit"] is None


def test_a_model_that_always_crashes_backs_off_and_says_so(tmp_path):
    sup = supervisor(tmp_path, "segfaults_always", first_backoff_s=30)
    with pytest.raises(RunnerLoadError, match=r"was killed by signal 11 \(SIGSEGV\) during load"):
        sup.start(spec())
    row = state(sup)
    assert row["state"] == "backing off"
    assert row["crashes_in_a_row"] == 2  # the first try and the self-check's retry
    assert 0 < row["retry_in"] <= 30
    with pytest.raises(RunnerBackoff, match="crashed 2 times in a row .* another \\d+ s"):
        sup.start(spec())


def test_a_background_request_is_background_in_the_runner_it_reached(tmp_path, runners):
    process = start(supervisor(tmp_path), runners)
    handle = process.submit(ask("hello", SamplingParams(max_tokens=200), priority="background"))
    deadline = time.monotonic() + 5
    rows = []
    while time.monotonic() < deadline and not rows:
        rows = process.snapshot().get("streams") or []
    handle.cancel()
    assert [row["priority"] for row in rows] == ["background"]


def _priorities(process) -> list[str]:
    return [row["priority"] for row in process.snapshot().get("streams") or []]


def test_a_priority_set_while_a_request_runs_reaches_the_engine_in_its_runner(tmp_path, runners):
    process = start(supervisor(tmp_path), runners)
    handle = process.submit(ask("hello", SamplingParams(max_tokens=400)))
    assert wait_until(lambda: _priorities(process) == ["interactive"])

    handle.set_priority("background")  # the handle -> SetPriority -> engine.set_priority
    assert wait_until(lambda: _priorities(process) == ["background"])
    handle.set_priority("interactive")
    assert wait_until(lambda: _priorities(process) == ["interactive"])

    process.set_priority("no-such-request", "background")  # ignored there
    with pytest.raises(ValueError):
        handle.set_priority("urgent")  # refused here, before it is sent
    handle.cancel()
    assert handle.result(timeout=10).type == "done"  # the runner served on


def test_the_background_itl_target_setting_is_part_of_every_runners_launch(tmp_path, settings):
    from inference.serving.hosting import make_supervisor

    settings.BACKGROUND_ITL_TARGET_MS = 2500
    sup = make_supervisor()
    assert sup.background_itl_target == 2.5
    process = RunnerProcess("m", spec().config, background_itl_target=sup.background_itl_target)
    assert process.launch.background_itl_target == 2.5
