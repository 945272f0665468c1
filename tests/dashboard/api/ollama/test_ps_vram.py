"""`/api/ps`'s size_vram is what llama.cpp put on the GPU, as its runner reports it."""

from django.utils import timezone

from dashboard.api.ollama.shapes import process

GiB = 1 << 30
ROW = {"name": "smollm2-135m-instruct", "size_bytes": GiB, "expires_in": 60.0}


def test_the_weights_on_the_gpu_are_what_llama_cpp_allocated_there(starter_model):
    runner = {"gpu_offload": True, "gpu_buffers": {"weights": GiB // 2, "kv": GiB}}
    assert process(ROW, starter_model, runner, timezone.now())["size_vram"] == GiB // 2


def test_a_cpu_build_puts_nothing_on_a_gpu_whatever_the_setting(starter_model):
    runner = {"gpu_offload": False, "gpu_buffers": {}}
    assert process(ROW, starter_model, runner, timezone.now())["size_vram"] == 0


def test_a_runner_that_does_not_say_is_reckoned_from_the_layers_setting(starter_model):
    starter_model.n_gpu_layers, starter_model.layer_count = 12, 24
    shown = process(ROW, starter_model, {"gpu_offload": True}, timezone.now())
    assert shown["size_vram"] == int(GiB * 12 / 25)
