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


def toolkit_has_cublas(nvcc: str) -> bool:
    home = Path(nvcc).resolve().parent.parent
    return any(home.glob("lib*/libcublas.so*")) or any(home.glob("targets/*/lib/libcublas.so*"))


def pip_cublas(paths: list[str] | None = None) -> tuple[Path, Path] | None:
    """(lib folder, include folder) of cuBLAS in a pip package (nvidia-cublas, which PyTorch's
    CUDA wheels bring), for a CUDA toolkit installed without it: ggml's CUDA backend links
    cuBLAS. None when no package has both the library and its headers."""
    for entry in paths if paths is not None else sys.path:
        nvidia = Path(entry or ".") / "nvidia"
        if not nvidia.is_dir():
            continue
        for library in sorted(nvidia.rglob("libcublas.so*")):
            for include in (library.parent.parent / "include", library.parent / "include"):
                if (include / "cublas_v2.h").exists():
                    return library.parent, include
    return None


def cublas_options(lib: Path, include: Path) -> list[str]:
    """CMake's FindCUDAToolkit told where cuBLAS is: its cached library paths, and the headers
    on the include path of CUDA and C++ sources."""
    options = []
    for name in ("cublas", "cublasLt"):
        found = sorted(lib.glob(f"lib{name}.so*"), key=lambda p: len(p.name))
        if found:
            options.append(f"-DCUDA_{name}_LIBRARY={found[0]}")
    flags = f"-I{include}"
    return options + [f"-DCMAKE_CUDA_FLAGS={flags}", f"-DCMAKE_CXX_FLAGS={flags}"]


DRIVER_FOLDERS = ("/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/usr/lib/x86_64-linux-gnu",
                  "/usr/lib64", "/usr/lib/wsl/lib")  # fmt: skip


def driver_options(nvcc: str) -> list[str]:
    """How ggml's CUDA backend links the driver library (libcuda, for its virtual-memory pool):
    CMake finds the toolkit's stub by itself; a toolkit without stubs is given the driver's own
    library (a container's driver mount); with neither, the pool without VMM (GGML_CUDA_NO_VMM),
    which needs no libcuda at link time."""
    home = Path(nvcc).resolve().parent.parent
    if any(home.glob("lib*/stubs/libcuda.so")) or any(home.glob("targets/*/lib/stubs/libcuda.so")):
        return []
    for folder in DRIVER_FOLDERS:
        found = sorted(Path(folder).glob("libcuda.so*"), key=lambda p: len(p.name))
        if found:
            return [f"-DCUDA_cuda_driver_LIBRARY={found[0]}"]
    return ["-DGGML_CUDA_NO_VMM=ON"]


def build_llama(source: Path, build: Path, log: Path, *, cuda_architectures: str | None,
                timeout: float, jobs: int | None = None) -> dict:  # fmt: skip
    """Configure and build TARGETS; returns the options, the bin folder and the seconds."""
    started = time.perf_counter()
    options = list(CMAKE_OPTIONS)
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    env = dict(os.environ)
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    cublas = None
    if cuda_architectures:
        options += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={cuda_architectures}"]
        if os.access(nvcc, os.X_OK):
            env["CUDACXX"] = nvcc
            options += driver_options(nvcc)
            if not toolkit_has_cublas(nvcc) and (cublas := pip_cublas()) is not None:
                options += cublas_options(*cublas)
                env["LD_LIBRARY_PATH"] = os.pathsep.join(
                    filter(None, [str(cublas[0]), env.get("LD_LIBRARY_PATH")]))
    deadline = time.monotonic() + timeout
    run_logged(["cmake", "-S", str(source / "vendor" / "llama.cpp"), "-B", str(build),
                *generator, *options], log, timeout=timeout, env=env)  # fmt: skip
    configured = time.perf_counter() - started
    run_logged(["cmake", "--build", str(build), "--parallel", str(jobs or os.cpu_count() or 1),
                "--target", *TARGETS], log, timeout=max(1.0, deadline - time.monotonic()),
               env=env)  # fmt: skip
    return {"cmake_options": options, "bin": str(build / "bin"),
            "cublas_from_pip": str(cublas[0]) if cublas else None,
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


def gpu_offload(python_path: str, library_path: str | None = None) -> bool | None:
    """What the assembled llama_cpp says: llama_supports_gpu_offload(), in a fresh process."""
    env = {**os.environ, "PYTHONPATH": python_path}
    if library_path:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [library_path,
                                                               env.get("LD_LIBRARY_PATH")]))
    done = subprocess.run([sys.executable, "-c", "import llama_cpp; "
                           "print(llama_cpp.llama_supports_gpu_offload())"],
                          capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    if done.returncode != 0:
        return None
    return done.stdout.strip().endswith("True")
