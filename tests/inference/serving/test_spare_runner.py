"""The spare runner: after a load, an interpreter waits with a load's imports done, and the
next load starts in it; a supervisor that closes lets it go."""

import psutil
import pytest

from inference.engine import SamplingParams
from inference.engine.host import ModelSpec
from inference.engine.runner_config import RunnerConfig
from inference.serving.supervisor import RunnerSupervisor
from tests.inference.engine.fakes import ask, wait_until

pytestmark = pytest.mark.model


def spec(path: str) -> ModelSpec:
    return ModelSpec("starter", RunnerConfig(model_path=str(path), ctx_per_seq=512, parallel=1,
                                             cache_slots=0, n_threads=2))  # fmt: skip


def test_the_next_load_starts_in_the_spare_runner(tmp_path, starter_path):
    supervisor = RunnerSupervisor(state_dir=tmp_path, spare_runner=True)
    first = supervisor.start(spec(starter_path))
    assert wait_until(lambda: supervisor._spare is not None, timeout=30)
    spare_pid = supervisor._spare.process.pid

    def imported() -> bool:  # llama.cpp's library is mapped: its imports are done
        return "llama_cpp" in " ".join(m.path for m in psutil.Process(spare_pid).memory_maps())

    assert wait_until(imported, timeout=30)
    first.shutdown()
    second = supervisor.start(spec(starter_path))
    assert second.pid == spare_pid
    done = list(second.submit(ask("Hello", SamplingParams(max_tokens=3))).events(timeout=60))
    assert done[-1].type == "done"
    second.shutdown()
    assert wait_until(lambda: supervisor._spare is not None, timeout=30)
    last = supervisor._spare.process
    supervisor.close()
    assert last.wait(10) is not None and supervisor._spare is None


def test_without_it_no_interpreter_waits(tmp_path, starter_path):
    supervisor = RunnerSupervisor(state_dir=tmp_path)
    supervisor.start(spec(starter_path)).shutdown()
    assert supervisor._spare is None
