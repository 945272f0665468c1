"""Runner factories that a runner process under test loads instead of llama.cpp's
(RunnerSupervisor(runner_factory="tests.inference.serving.runner_factories:NAME")). They run in
the runner process, so a fault here kills that process for real, as a native fault would."""

import os
import signal

from tests.inference.engine.fakes import FakeRunner

# Slow enough that a test can act between two tokens: 20 ms a step.
STEP_S = 0.02


def fake(config) -> FakeRunner:
    return FakeRunner(n_ctx=2048, n_slots=4, ctx_per_seq=512, n_batch=64, overhead=STEP_S)


def segfaults_with_extra_bufts(config) -> FakeRunner:
    """A host whose CPU advertises AMX that its hypervisor does not deliver."""
    if config.use_extra_bufts:
        os.kill(os.getpid(), signal.SIGSEGV)
    return fake(config)


def segfaults_always(config) -> FakeRunner:
    """A model that kills llama.cpp however it is loaded."""
    os.kill(os.getpid(), signal.SIGSEGV)
    raise AssertionError("unreachable")


def refuses(config) -> FakeRunner:
    """A load that fails cleanly, as llama.cpp refusing a file does."""
    raise RuntimeError("llama.cpp could not load the model")


def llama_with_an_aborting_picture_decoder(config):
    """The real runner, whose picture decoder process dies (SIGABRT) on a poisoned picture
    (tests.inference.engine.picture_decoders), as stb_image would on hostile bytes."""
    from inference.engine.picture_decoder import PictureDecoder
    from inference.engine.runner import LlamaRunner
    from tests.inference.engine.picture_decoders import aborts_on_poison

    return LlamaRunner(config, pictures=PictureDecoder(aborts_on_poison))
