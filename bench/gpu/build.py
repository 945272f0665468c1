"""Installing and building on the GPU machine, from the files prepare.py left in .gpu-carry/, with
no network. Standard library only: it runs before anything is installed.

1. The wheels go into a folder of their own (`--target`), put first on PYTHONPATH: the machine's
   own packages stay as they are.
2. llama.cpp, from llama-cpp-python's trimmed source, is built once with CMake for this card's
   architecture only (tools/llama_build.py asks nvidia-smi, as `make install` does): the
   libraries llama-cpp-python loads and llama-bench, llama-batched-bench and llama-server, all
   from one compile of the same source with the same options. That is llama-cpp-python's own
   build (its CMakeLists adds this llama.cpp with BUILD_SHARED_LIBS and LLAMA_BUILD_COMMON on,
   LLAMA_CURL off) with the tools on; a pip build would compile the CUDA kernels, most of the
   time, a second time for the tools.
3. llama-cpp-python's Python package is put beside the wheels with those libraries in its lib/,
   where it loads them from: what `pip install` of a CUDA build lays out.
"""

import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TARGETS = ("llama", "ggml", "mtmd", "llama-bench", "llama-batched-bench", "llama-server")
# llama-cpp-python's CMake options (its CMakeLists.txt), the tools', and what a machine without
# network or extra libraries needs: no web UI download, no OpenSSL, no NCCL (one GPU).
CMAKE_OPTIONS = ("-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DLLAMA_BUILD_COMMON=ON",
                 "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
                 "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_APP=OFF",
                 "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF",
                 "-DGGML_CUDA_NCCL=OFF")  # fmt: skip


def run_logged(command: list[str], log: Path, timeout: float, env: dict | None = None) -> None:
    """Run, appending its output to `log`; CalledProcessError (or TimeoutExpired) on failure."""
    with open(log, "a") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                       timeout=timeout, check=True, env=env)  # fmt: skip


def install_wheels(wheels: Path, site: Path, log: Path) -> dict:
    started = time.perf_counter()
    found = sorted(str(p) for p in wheels.glob("*.whl"))
    site.mkdir(parents=True, exist_ok=True)
    run_logged([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(site), *found],
               log, timeout=300)  # fmt: skip
    return {"wheels": len(found), "seconds": round(time.perf_counter() - started, 1)}


def unpack(source: Path, into: Path) -> Path:
    """The trimmed sdist unpacked; returns its top folder."""
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(source) as tar:
        top = tar.getmembers()[0].name.split("/")[0]
        tar.extractall(into, filter="data")
    return into / top


def build_llama(source: Path, build: Path, log: Path, *, cuda_architectures: str | None,
                timeout: float, jobs: int | None = None) -> dict:  # fmt: skip
    """Configure and build TARGETS; returns the options, the bin folder and the seconds."""
    started = time.perf_counter()
    options = list(CMAKE_OPTIONS)
    if cuda_architectures:
        options += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={cuda_architectures}"]
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    env = dict(os.environ)
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if cuda_architectures and os.access(nvcc, os.X_OK):
        env["CUDACXX"] = nvcc
    deadline = time.monotonic() + timeout
    run_logged(["cmake", "-S", str(source / "vendor" / "llama.cpp"), "-B", str(build),
                *generator, *options], log, timeout=timeout, env=env)  # fmt: skip
    configured = time.perf_counter() - started
    run_logged(["cmake", "--build", str(build), "--parallel", str(jobs or os.cpu_count() or 1),
                "--target", *TARGETS], log, timeout=max(1.0, deadline - time.monotonic()),
               env=env)  # fmt: skip
    return {"cmake_options": options, "bin": str(build / "bin"),
            "configure_seconds": round(configured, 1),
            "seconds": round(time.perf_counter() - started, 1)}  # fmt: skip


def assemble_llama_cpp(source: Path, bin_dir: Path, site: Path) -> Path:
    """llama-cpp-python's package in `site`, with the built libraries in its lib/."""
    package = site / "llama_cpp"
    if package.exists():
        shutil.rmtree(package)
    shutil.copytree(source / "llama_cpp", package)
    lib = package / "lib"
    lib.mkdir(exist_ok=True)
    for library in bin_dir.glob("lib*.so*"):
        shutil.copy2(library, lib / library.name, follow_symlinks=True)
    return package


def gpu_offload(python_path: str) -> bool | None:
    """What the assembled llama_cpp says: llama_supports_gpu_offload(), in a fresh process."""
    env = {**os.environ, "PYTHONPATH": python_path}
    done = subprocess.run([sys.executable, "-c", "import llama_cpp; "
                           "print(llama_cpp.llama_supports_gpu_offload())"],
                          capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    if done.returncode != 0:
        return None
    return done.stdout.strip().endswith("True")
