"""The GPU check's CPU side (bench/gpu/): what the carried source keeps, the model it builds on
the starter's tokenizer, and how its figures become the issue's goals."""

import pytest

from bench.gpu.check import goals, ratios
from bench.gpu.prepare import kept, trimmed_tools_cmake

LLAMA = "vendor/llama.cpp/"


@pytest.mark.parametrize("path", [
    "llama_cpp/llama_cpp.py", "CMakeLists.txt", "pyproject.toml",
    LLAMA + "CMakeLists.txt", LLAMA + "src/llama-model.cpp", LLAMA + "common/arg.cpp",
    LLAMA + "ggml/src/ggml-cuda/fattn.cu",
    LLAMA + "ggml/src/ggml-cuda/template-instances/mmq-instance-q4_0.cu",
    LLAMA + "ggml/src/ggml-cpu/ggml-cpu.c", LLAMA + "ggml/src/ggml.c",
    LLAMA + "tools/llama-bench/llama-bench.cpp", LLAMA + "tools/server/server.cpp",
    LLAMA + "tools/batched-bench/batched-bench.cpp", LLAMA + "tools/mtmd/mtmd.cpp",
    LLAMA + "tools/ui/CMakeLists.txt", LLAMA + "scripts/ui-assets.cmake",
    LLAMA + "vendor/cpp-httplib/httplib.h", LLAMA + "LICENSE",
])  # fmt: skip
def test_the_trimmed_source_keeps_what_a_cuda_build_and_its_tools_read(path):
    assert kept(path)


@pytest.mark.parametrize("path", [
    "docs/index.md", "tests/test_llama.py", "examples/low_level_api/x.py",
    LLAMA + "models/ggml-vocab-llama-bpe.gguf", LLAMA + "docs/build.md",
    LLAMA + "ggml/src/ggml-vulkan/ggml-vulkan.cpp", LLAMA + "ggml/src/ggml-metal/ggml-metal.m",
    LLAMA + "ggml/src/ggml-sycl/ggml-sycl.cpp", LLAMA + "tools/quantize/quantize.cpp",
    LLAMA + "tools/ui/src/App.svelte", LLAMA + "tools/server/tests/unit/test_basic.py",
    LLAMA + "tools/mtmd/test-2.mp3", LLAMA + "scripts/sync-ggml.sh", LLAMA + "gguf-py/setup.py",
])  # fmt: skip
def test_it_leaves_out_what_no_build_of_ours_reads(path):
    assert not kept(path)


def test_the_tools_cmakelists_lists_only_the_tools_the_check_builds():
    text = trimmed_tools_cmake()
    for tool in ("llama-bench", "batched-bench", "server", "mtmd", "ui"):
        assert f"add_subdirectory({tool})" in text
    assert "quantize" not in text and "perplexity" not in text


@pytest.mark.model
def test_the_check_model_has_the_starters_tokenizer_and_never_ends_early(
    starter_path, tmp_path, extra_bufts
):
    from bench.gpu.model import synthesize, write_skeleton
    from inference.engine import Engine, GenerationRequest, SamplingParams
    from inference.engine.runner import LlamaRunner
    from inference.engine.runner_config import RunnerConfig
    from inference.gguf import read_gguf

    skeleton = tmp_path / "skeleton.gguf"
    write_skeleton(starter_path, skeleton)
    assert skeleton.stat().st_size < 3_000_000 and read_gguf(skeleton).tensors == ()
    model = tmp_path / "tiny.gguf"
    facts = synthesize(skeleton, model, "tiny")
    info = read_gguf(model)
    assert (info.block_count, info.context_length, info.vocab_size) == (4, 16384, 49152)
    assert facts["params"] > 0 and info.metadata["tokenizer.chat_template"]

    config = RunnerConfig(model_path=str(model), ctx_per_seq=512, parallel=1, cache_slots=0,
                          n_threads=2, use_extra_bufts=extra_bufts)  # fmt: skip
    engine = Engine(LlamaRunner(config), itl_target=0.1).start()
    try:
        greedy = SamplingParams(temperature=0, max_tokens=48)
        handle = engine.submit(GenerationRequest("<|im_start|>user\nHi<|im_end|>\n", greedy))
        done = list(handle.events(timeout=120))[-1]
    finally:
        engine.shutdown()
    assert done.type == "done" and done.figures["output_tokens"] == 48


def test_the_figures_become_the_issues_goals():
    figures = {
        "llama_bench": {"pp_tps": 20000.0, "tg_tps": 400.0},
        "engine": {"prefill_tps": 19500.0, "decode_tps": 372.0, "batch4_tps": 1300.0},
        "raw": {"prefill_tps": 19800.0, "decode_tps": 390.0, "batch4_tps": 1350.0},
        "batched": {"tg_tps_1": 410.0, "tg_tps_4": 1400.0},
        "engine_stall": {"a_itl_max_s": 0.06, "b_ttft_with_a_s": 0.55, "b_ttft_alone_s": 0.5},
        "server_stall": {"a_itl_max_s": 0.42, "b_ttft_with_a_s": 0.45, "b_ttft_alone_s": 0.44},
        "appliance": {"memory_check": {"estimate_gpu_bytes": 1050, "nvml_runner_bytes": 1000}},
    }
    figures.update(ratios(figures))
    figures["check_seconds"] = 480.0
    assert figures["decode_ratio"] == 0.93 and figures["prefill_ratio"] == 0.975
    assert figures["engine_b_ttft_ratio"] == 1.1 and figures["estimate_error_vs_nvml"] == 0.05
    verdicts = {row["figure"]: row["met"] for row in goals(figures)}
    assert verdicts == {"decode_ratio": False, "prefill_ratio": True, "batch4_ratio": True,
                        "engine_a_itl_max_s": True, "engine_b_ttft_ratio": True,
                        "estimate_error_vs_nvml": True, "check_seconds": True}  # fmt: skip


def test_a_goal_whose_step_did_not_run_is_not_measured_rather_than_missed():
    (row,) = [row for row in goals({}) if row["figure"] == "decode_ratio"]
    assert row["met"] is None and row["value"] is None


def test_a_toolkit_without_cublas_builds_against_the_one_pytorchs_wheels_bring(tmp_path):
    from bench.gpu.build import cublas_options, pip_cublas, toolkit_has_cublas

    toolkit = tmp_path / "cuda-13.0"
    (toolkit / "bin").mkdir(parents=True)
    (toolkit / "lib64").mkdir()
    (toolkit / "lib64" / "libcudart.so.13").touch()
    assert not toolkit_has_cublas(str(toolkit / "bin" / "nvcc"))  # as on this development box

    site = tmp_path / "site-packages"
    lib, include = site / "nvidia" / "cu13" / "lib", site / "nvidia" / "cu13" / "include"
    lib.mkdir(parents=True)
    include.mkdir()
    for name in ("libcublas.so.13", "libcublasLt.so.13"):
        (lib / name).touch()
    assert pip_cublas([str(tmp_path / "elsewhere"), str(site)]) is None  # no headers yet
    (include / "cublas_v2.h").touch()
    assert pip_cublas([str(site)]) == (lib, include)
    assert cublas_options(lib, include) == [
        f"-DCUDA_cublas_LIBRARY={lib / 'libcublas.so.13'}",
        f"-DCUDA_cublasLt_LIBRARY={lib / 'libcublasLt.so.13'}",
        f"-DCMAKE_CUDA_FLAGS=-I{include}", f"-DCMAKE_CXX_FLAGS=-I{include}",
    ]  # fmt: skip
