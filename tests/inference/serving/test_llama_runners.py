"""Runner processes on real llama.cpp with the starter model: the answers, a native fault
mid-stream, two models at once, and a supervisor that never loads llama.cpp itself."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from inference.engine import SamplingParams
from inference.engine.host import EngineHost, ModelSpec
from inference.engine.runner_config import RunnerConfig
from inference.serving.supervisor import RunnerSupervisor
from tests.inference.engine.fakes import ask

pytestmark = pytest.mark.model

CHAT = "<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture
def model_spec(starter_path, extra_bufts):
    def make(name: str = "smol") -> ModelSpec:
        config = RunnerConfig(
            str(starter_path), ctx_per_seq=512, parallel=2, cache_slots=1, n_threads=2,
            use_extra_bufts=extra_bufts,
        )  # fmt: skip
        return ModelSpec(name, config, -1)

    return make


@pytest.fixture
def supervisor(tmp_path):
    return RunnerSupervisor(state_dir=tmp_path)


@pytest.fixture
def host(supervisor):
    host = EngineHost(engine_factory=supervisor.start, max_loaded=2)
    yield host
    host.shutdown()


def answer(host, spec, question: str, max_tokens: int = 12):
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    handle = host.submit(spec, ask(CHAT.format(question=question), params))
    return handle.result(timeout=120)


def runner_pid(supervisor, name: str) -> int:
    (row,) = [r for r in supervisor.states() if r["model"] == name]
    return row["pid"]


def test_a_runner_process_answers_as_the_engine_does_in_process(host, model_spec):
    from inference.engine import Engine
    from inference.engine.runner import LlamaRunner

    spec = model_spec()
    remote = answer(host, spec, "Name a colour.")
    local_engine = Engine(LlamaRunner(spec.config)).start()
    try:
        params = SamplingParams(temperature=0, max_tokens=12)
        handle = local_engine.submit(ask(CHAT.format(question="Name a colour."), params))
        local = handle.result(timeout=120)
    finally:
        local_engine.shutdown()
    assert remote.type == local.type == "done"
    assert remote.text == local.text != ""
    assert remote.figures["ttft"] > 0 and remote.figures["decode_tps"] > 0


def test_a_segfault_mid_answer_ends_it_with_the_reason_and_the_next_request_is_served(
    host, supervisor, model_spec
):
    spec = model_spec()
    story = CHAT.format(question="Tell me a long story about a robot.")
    handle = host.submit(spec, ask(story, SamplingParams(temperature=0.8, max_tokens=400, seed=1)))
    tokens = []
    for event in handle.events(timeout=120):
        if event.type == "token":
            tokens.append(event.text)
            if len(tokens) == 5:
                break
    pid = runner_pid(supervisor, "smol")
    os.kill(pid, signal.SIGSEGV)
    killed = time.monotonic()
    final = handle.result(timeout=3)
    assert time.monotonic() - killed < 3
    assert final.type == "error"
    assert "killed by signal 11 (SIGSEGV) during decode" in final.message

    after = answer(host, spec, "Name a fruit.")
    assert after.type == "done" and after.text
    assert runner_pid(supervisor, "smol") not in (None, pid)


def test_a_picture_that_kills_the_runners_decoder_fails_alone_and_the_runner_goes_on(
    tmp_path, starter_path, extra_bufts
):
    """The runner decodes pictures in a decoder process of its own: one that dies on a picture
    fails that request with a clear "invalid" error, while the runner process (the same pid)
    finishes a stream it was serving and reads the next picture."""
    from inference.engine.generation import GenerationRequest
    from inference.engine.media import MEDIA_MARKER, Image
    from inference.engine.refusals import RefusalKind
    from tests.inference.engine.picture_decoders import POISON
    from tests.inference.projector_gguf import picture, write_projector

    factory = "tests.inference.serving.runner_factories:llama_with_an_aborting_picture_decoder"
    supervisor = RunnerSupervisor(state_dir=tmp_path, runner_factory=factory)
    host = EngineHost(engine_factory=supervisor.start, max_loaded=1)
    projector = write_projector(tmp_path / "mmproj.gguf", starter_path)
    config = RunnerConfig(str(starter_path), mmproj_path=str(projector), ctx_per_seq=512,
                          parallel=2, cache_slots=1, n_threads=2,
                          use_extra_bufts=extra_bufts)  # fmt: skip
    spec = ModelSpec("smol-vision", config, -1)
    greedy = SamplingParams(temperature=0, max_tokens=8)

    def pictured(data: bytes):
        prompt = CHAT.format(question=f"What is this?\n{MEDIA_MARKER}")
        request = GenerationRequest(prompt, greedy, media=(Image.from_bytes(data),))
        return host.submit(spec, request).result(timeout=120)

    try:
        counting = CHAT.format(question="Count from one to forty in words.")
        stream = host.submit(spec, ask(counting, SamplingParams(temperature=0, max_tokens=80)))
        events = stream.events(timeout=120)
        assert next(e for e in events if e.type == "token")
        pid = runner_pid(supervisor, "smol-vision")
        crashed = pictured(picture(64, 48, seed=21) + POISON)
        assert crashed.type == "error" and crashed.code == RefusalKind.INVALID
        assert "the image could not be decoded" in crashed.message
        final = None
        for final in events:  # noqa: B007 - the last event is the stream's end
            pass
        assert final.type == "done" and final.text
        good = pictured(picture(64, 48, seed=21))
        assert good.type == "done" and good.text
        assert runner_pid(supervisor, "smol-vision") == pid
    finally:
        host.shutdown()


def test_two_models_loaded_at_once_both_answer_from_their_own_processes(
    host, supervisor, model_spec
):
    first, second = model_spec("first"), model_spec("second")
    params = SamplingParams(temperature=0, max_tokens=16)
    handles = [
        host.submit(spec, ask(CHAT.format(question="Count to five."), params))
        for spec in (first, second)
    ]  # fmt: skip
    finals = [handle.result(timeout=120) for handle in handles]
    assert [f.type for f in finals] == ["done", "done"]
    assert finals[0].text == finals[1].text  # the same file, greedy: the same answer
    assert sorted(r["name"] for r in host.loaded()) == ["first", "second"]
    assert runner_pid(supervisor, "first") != runner_pid(supervisor, "second")


SUPERVISOR_SCRIPT = textwrap.dedent("""
    import json, os, sys
    from inference.engine import GenerationRequest, SamplingParams
    from inference.engine.host import EngineHost, ModelSpec
    from inference.engine.runner_config import RunnerConfig
    from inference.serving.supervisor import RunnerSupervisor

    config = RunnerConfig(sys.argv[1], ctx_per_seq=256, parallel=1, cache_slots=0, n_threads=2,
                          use_extra_bufts=sys.argv[2] == "1")
    supervisor = RunnerSupervisor()
    host = EngineHost(engine_factory=supervisor.start)
    asked = GenerationRequest("Hello", SamplingParams(max_tokens=4))
    done = host.submit(ModelSpec("m", config, -1), asked)
    final = done.result(timeout=120)
    (pid,) = supervisor.pids()
    maps = lambda p: open(f"/proc/{p}/maps").read()
    print(json.dumps({
        "answer": final.type,
        "imported": "llama_cpp" in sys.modules,
        "mapped": "libllama" in maps(os.getpid()),
        "runner_mapped": "libllama" in maps(pid),
    }))
    host.shutdown()
""")


def test_the_supervising_process_never_loads_llama_cpp(starter_path, extra_bufts):
    import json

    done = subprocess.run(
        [sys.executable, "-c", SUPERVISOR_SCRIPT, str(starter_path), "1" if extra_bufts else "0"],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"answer": "done", "imported": False, "mapped": False, "runner_mapped": True}
