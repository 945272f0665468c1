"""A runner on a GPU calibrates its step costs at load, speculation or not: the cost model's
CPU-like priors would otherwise read the first long prompt in tiny chunks; on the CPU the
calibration stays with speculation, as before."""

from inference.engine import Engine
from inference.serving.runner_main import on_gpu, warm_up
from tests.inference.engine.fakes import FakeRunner


class CalibratingRunner(FakeRunner):
    def __init__(self, info: dict):
        super().__init__(n_batch=2048)
        self.extra = info
        self.calibrated = 0

    def info(self) -> dict:
        return {**super().info(), **self.extra}

    def calibrate(self) -> list[tuple[int, float]]:
        self.calibrated += 1
        return [(1, 0.002), (2, 0.0021), (4, 0.0022), (512, 0.004)]


def warmed(info: dict) -> tuple[Engine, CalibratingRunner]:
    runner = CalibratingRunner(info)
    engine = Engine(runner, itl_target=0.1).start()
    try:
        warm_up(engine)
    finally:
        engine.shutdown()
    return engine, runner


def test_a_runner_with_layers_on_a_gpu_is_calibrated_at_load():
    engine, runner = warmed({"gpu_offload": True, "gpu_layers": 31})
    assert runner.calibrated == 1
    # What a step costs there is measured, not the priors': a 512-token chunk fits the target.
    assert engine.budget.tokens(decoding=1) >= 512


def test_a_cpu_runner_without_speculation_is_not():
    _, runner = warmed({"gpu_offload": False, "gpu_layers": None})
    assert runner.calibrated == 0


def test_a_gpu_build_with_every_layer_on_the_cpu_counts_as_the_cpu():
    assert not on_gpu({"gpu_offload": True, "gpu_layers": 0})
    assert on_gpu({"gpu_offload": True, "gpu_layers": 1})
