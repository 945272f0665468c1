"""What llama.cpp allocated for a loaded model, read from the lines it logs while loading.

llama.cpp reports each buffer it allocates, per device, at INFO level ("load_tensors:  CUDA0
model buffer size = 1234.56 MiB", "llama_kv_cache:  CUDA0 KV buffer size = ...",
"sched_reserve:  CUDA0 compute buffer size = ...", "llama_context:  CUDA_Host  output buffer
size = ..."), and how many layers went to the GPU ("offloaded 31/31 layers to GPU"); its C API
has no call for either. The runner (inference.engine.runner) hands this module the lines of its
own load; this module only reads them, so it runs and is tested without llama.cpp.

A device is a GPU unless it is the host: "CPU", "CPU_Mapped" (the mmapped file), "CPU_REPACK",
"AMX", or a GPU backend's pinned host memory ("CUDA_Host"). The embedding context, made later
on first use, is not counted.
"""

import re

MiB = 1 << 20
# llama.cpp's word for a buffer -> the part of the memory panel it belongs to. "RS" is a
# recurrent model's state, its KV cache.
PARTS = {"model": "weights", "KV": "kv", "RS": "kv", "compute": "compute", "output": "output"}
_BUFFER = re.compile(
    r"^\s*\w+:\s+(?P<device>\S+)\s+(?P<kind>model|KV|RS|compute|output) buffer size\s*=\s*"
    r"(?P<mib>[0-9.]+) MiB"
)
_OFFLOADED = re.compile(r"offloaded (?P<done>\d+)/(?P<all>\d+) layers to GPU")
_HOST = ("CPU", "AMX")


def is_gpu(device: str) -> bool:
    return not device.startswith(_HOST) and not device.endswith("_Host")


def read_load_log(lines: list[str]) -> dict:
    """{"buffers": {part: {device: bytes}}, "gpu_layers": n or None, "layers": n or None} from
    the lines llama.cpp logged during one load (later lines of a device add up)."""
    buffers: dict[str, dict[str, int]] = {}
    offloaded = None
    for line in lines:
        found = _BUFFER.match(line)
        if found:
            part = buffers.setdefault(PARTS[found["kind"]], {})
            device = found["device"]
            part[device] = part.get(device, 0) + round(float(found["mib"]) * MiB)
            continue
        layers = _OFFLOADED.search(line)
        if layers:
            offloaded = layers
    return {
        "buffers": buffers,
        "gpu_layers": int(offloaded["done"]) if offloaded else None,
        "layers": int(offloaded["all"]) if offloaded else None,
    }


def gpu_split(buffers: dict[str, dict[str, int]]) -> dict[str, int]:
    """Bytes on GPUs per part (weights, kv, compute), all devices together; empty when
    nothing of the model is on a GPU."""
    split = {}
    for part in ("weights", "kv", "compute"):
        on_gpu = sum(n for device, n in (buffers.get(part) or {}).items() if is_gpu(device))
        if on_gpu:
            split[part] = on_gpu
    return split
