"""A runner's memory as llama.cpp reports it while loading: the buffers of each part (weights,
KV cache, compute) on each device, read from its load log; on a GPU build, the parts on GPUs."""

import pytest

from inference.engine.buffers import MiB, gpu_split, is_gpu, read_load_log

# Lines as this llama.cpp logs them (formats from src/llama-model.cpp, llama-kv-cache.cpp and
# llama-context.cpp): a CUDA load of every layer of a 1.7B model, and a CPU load of the starter.
CUDA_LOAD = [
    "load_tensors: offloading output layer to GPU\n",
    "load_tensors: offloading 24 repeating layers to GPU\n",
    "load_tensors: offloaded 25/25 layers to GPU\n",
    "load_tensors:        CUDA0 model buffer size =   888.05 MiB\n",
    "load_tensors:   CPU_Mapped model buffer size =   108.00 MiB\n",
    "llama_context:  CUDA_Host  output buffer size =     1.50 MiB\n",
    "llama_kv_cache:      CUDA0 KV buffer size =  3072.00 MiB\n",
    "llama_kv_cache: size = 3072.00 MiB ( 65536 cells,  24 layers,  8/8 seqs)\n",
    "sched_reserve:      CUDA0 compute buffer size =   304.00 MiB\n",
    "sched_reserve:  CUDA_Host compute buffer size =    20.02 MiB\n",
]
CPU_LOAD = [
    "print_info: file size   = 92.10 MiB (5.74 BPW) \n",
    "load_tensors:   CPU_Mapped model buffer size =    92.10 MiB\n",
    "llama_context:        CPU  output buffer size =     1.50 MiB\n",
    "llama_kv_cache:        CPU KV buffer size =   360.00 MiB\n",
    "sched_reserve:        CPU compute buffer size =   102.51 MiB\n",
]


def test_a_cuda_load_is_split_into_weights_kv_and_compute_on_the_gpu():
    load = read_load_log(CUDA_LOAD)
    assert load["gpu_layers"] == 25 and load["layers"] == 25
    assert load["buffers"]["weights"] == {"CUDA0": round(888.05 * MiB),
                                          "CPU_Mapped": 108 * MiB}  # fmt: skip
    assert gpu_split(load["buffers"]) == {
        "weights": round(888.05 * MiB), "kv": 3072 * MiB, "compute": 304 * MiB,
    }  # fmt: skip


def test_pinned_host_memory_and_the_mapped_file_are_not_the_gpus():
    assert is_gpu("CUDA0") and is_gpu("CUDA1") and is_gpu("Vulkan0") and is_gpu("ROCm0")
    for host in ("CPU", "CPU_Mapped", "CPU_REPACK", "CUDA_Host", "AMX"):
        assert not is_gpu(host), host


def test_a_cpu_load_has_buffers_but_nothing_on_a_gpu():
    load = read_load_log(CPU_LOAD)
    assert load["buffers"]["kv"] == {"CPU": 360 * MiB}
    assert load["buffers"]["compute"] == {"CPU": round(102.51 * MiB)}
    assert gpu_split(load["buffers"]) == {} and load["gpu_layers"] is None


@pytest.mark.model
def test_the_runner_reports_what_llama_cpp_allocated_for_it(starter_path, extra_bufts):
    from inference.engine.runner import LlamaRunner
    from inference.engine.runner_config import RunnerConfig

    config = RunnerConfig(model_path=str(starter_path), ctx_per_seq=1024, parallel=2,
                          cache_slots=2, n_threads=2, use_extra_bufts=extra_bufts)  # fmt: skip
    runner = LlamaRunner(config)
    try:
        info = runner.info()
    finally:
        runner.close()
    buffers = info["buffers"]
    # 4 slots of 1024 cells: 30 layers x 3 KV heads x 64 x 2 (K and V) x 2 bytes x 4096.
    assert sum(buffers["kv"].values()) == 30 * 3 * 64 * 2 * 2 * 4096
    assert 80 * MiB < sum(buffers["weights"].values()) < 100 * MiB
    assert sum(buffers["compute"].values()) > 0
    if not info["gpu_offload"]:  # this CPU build: nothing on a GPU, and nothing said about it
        assert info["gpu_buffers"] == {} and info["gpu_layers"] is None
