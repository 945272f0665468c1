"""Which llama.cpp `make install` builds: CUDA for this box's NVIDIA card, or the CPU.

    python tools/llama_build.py [--pip PIP] [--venv DIR] [--show]

LLAMA_GPU chooses (one variable, `make install LLAMA_GPU=cpu`):
- `auto` (the default): CUDA when both a CUDA compiler (nvcc) and a usable NVIDIA card (nvidia-smi
  answers with the card's compute capability) are here, else the CPU. A compiler without a card
  (a build box, a container without the GPU passed through) builds for the CPU: a CUDA build
  with no card to run on would only fail at the first load.
- `cuda`: CUDA or an error that says what is missing. Without a card (building an image for
  another box) LLAMA_CUDA_ARCH names the architecture, e.g. `LLAMA_CUDA_ARCH=89`.
- `cpu`: the CPU, whatever is here.

CUDA is compiled for the local card's architecture only (CMAKE_CUDA_ARCHITECTURES=90 for compute
capability 9.0): one architecture builds in minutes where llama.cpp's default list takes far
longer.

pip keeps the wheels it built, and `pip install -e .` would hand back the CPU wheel it built
before. So this step installs llama-cpp-python itself, from source, with --no-cache-dir and
--force-reinstall, whenever the build wanted differs from the one recorded in the virtualenv
(DIR/llama-build.json); then `pip install -e .` finds the pinned version installed and leaves
it. A CPU build with nothing recorded is left to `pip install -e .`, as before.

Standard library only: it runs before anything is installed. `--show` prints the choice and what
is recorded, and changes nothing.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHOICES = ("auto", "cuda", "cpu")
STAMP = "llama-build.json"
PROBE_TIMEOUT_S = 20


class BuildError(Exception):
    """LLAMA_GPU asks for what this box cannot build; the message says what is missing."""


@dataclass(frozen=True)
class Build:
    backend: str  # "cuda" or "cpu"
    architectures: str  # CMAKE_CUDA_ARCHITECTURES ("90", "86;89", "native"); "" on the CPU
    reason: str  # why, in a sentence
    nvcc: str = ""  # the compiler found (CUDACXX for the build)

    @property
    def cmake_args(self) -> str:
        if self.backend == "cpu":
            return "-DGGML_CUDA=off"
        return f"-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES={self.architectures}"

    def same_build(self, recorded: dict | None) -> bool:
        return bool(recorded) and recorded.get("backend") == self.backend and (
            recorded.get("architectures", "") == self.architectures
        )


def find_nvcc(env: dict[str, str]) -> str | None:
    """nvcc on PATH, else in CUDA_HOME (or /usr/local/cuda, where NVIDIA's packages put it and
    often leave it off PATH); only one that answers `nvcc --version` counts."""
    candidates = [shutil.which("nvcc", path=env.get("PATH", ""))]
    home = env.get("CUDA_HOME") or env.get("CUDA_PATH") or "/usr/local/cuda"
    candidates.append(str(Path(home) / "bin" / "nvcc"))
    for nvcc in filter(None, candidates):
        if os.access(nvcc, os.X_OK) and _answers([nvcc, "--version"], env) is not None:
            return nvcc
    return None


def card_architectures(env: dict[str, str]) -> tuple[str | None, str]:
    """(CMAKE_CUDA_ARCHITECTURES for the cards nvidia-smi sees, or None; what it said). A driver
    too old to report compute_cap still proves a card: CMake's "native" then asks the card at
    build time."""
    smi = shutil.which("nvidia-smi", path=env.get("PATH", ""))
    if smi is None:
        return None, "nvidia-smi is not installed"
    out = _answers([smi, "--query-gpu=compute_cap,name", "--format=csv,noheader"], env)
    if out is None:
        listed = _answers([smi, "--list-gpus"], env)
        if listed and listed.strip():
            return "native", "nvidia-smi lists a card but not its compute capability"
        return None, "nvidia-smi does not answer (no card, or the driver is not loaded)"
    architectures, names = [], []
    for line in out.splitlines():
        cap, _, name = (part.strip() for part in line.partition(","))
        if re.fullmatch(r"\d+\.\d+", cap):
            architectures.append(cap.replace(".", ""))
            names.append(f"{name} (compute capability {cap})")
    if not architectures:
        return None, "nvidia-smi lists no card"
    unique = sorted(set(architectures), key=int)
    return ";".join(unique), ", ".join(names)


def _answers(command: list[str], env: dict[str, str]) -> str | None:
    """The command's output when it ran and succeeded, else None."""
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def choose(env: dict[str, str]) -> Build:
    """The build LLAMA_GPU asks for on this box (module docstring)."""
    wanted = (env.get("LLAMA_GPU") or "auto").strip().lower()
    if wanted not in CHOICES:
        raise BuildError(f"LLAMA_GPU must be one of {', '.join(CHOICES)}, got {wanted!r}")
    if wanted == "cpu":
        return Build("cpu", "", "LLAMA_GPU=cpu")
    nvcc = find_nvcc(env)
    architectures, card = card_architectures(env)
    forced = (env.get("LLAMA_CUDA_ARCH") or "").strip()
    if forced and not re.fullmatch(r"(\d+[a-z]?)(;\d+[a-z]?)*|native|all|all-major", forced):
        raise BuildError(f"LLAMA_CUDA_ARCH must look like 90 or 86;89, got {forced!r}")
    if wanted == "cuda":
        if nvcc is None:
            raise BuildError("LLAMA_GPU=cuda, but no CUDA compiler (nvcc) is on PATH or in "
                             "CUDA_HOME/bin: install the CUDA toolkit or set CUDA_HOME")
        if not (forced or architectures):
            raise BuildError(f"LLAMA_GPU=cuda, but {card}: set LLAMA_CUDA_ARCH (e.g. 89) to "
                             "build for a card that is not here")  # fmt: skip
        return Build("cuda", forced or architectures, f"LLAMA_GPU=cuda; {card}", nvcc)
    if nvcc is None:
        why = f"{card}, and " if architectures is None else f"{card} is here, but "
        return Build("cpu", "", why + "no CUDA compiler (nvcc) was found")
    if architectures is None:
        return Build("cpu", "", f"nvcc is here, but {card}")
    return Build("cuda", forced or architectures, f"nvcc and {card}", nvcc)


def pinned_version() -> str:
    """llama-cpp-python's pin, from pyproject.toml: the one place it is declared."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    found = re.search(r'"llama-cpp-python==([^"]+)"', text)
    if found is None:
        raise BuildError("pyproject.toml pins no llama-cpp-python version")
    return found.group(1)


def recorded(venv: Path) -> dict | None:
    try:
        return json.loads((venv / STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def install(build: Build, pip: str, venv: Path, env: dict[str, str]) -> bool:
    """Build and install llama-cpp-python when `build` is not the one recorded; True if it
    ran pip."""
    version = pinned_version()
    before = recorded(venv)
    if build.same_build(before) and before.get("version") == version:
        return False
    if build.backend == "cpu" and before is None:
        return False  # `pip install -e .` builds (or reuses) the CPU wheel, as it always has
    build_env = {**env, "CMAKE_ARGS": build.cmake_args, "FORCE_CMAKE": "1"}
    if build.nvcc:
        build_env["CUDACXX"] = build.nvcc
        build_env["PATH"] = os.pathsep.join([str(Path(build.nvcc).parent), env.get("PATH", "")])
    command = [pip, "install", "--force-reinstall", "--no-deps", "--no-cache-dir",
               "--no-binary", "llama-cpp-python", f"llama-cpp-python=={version}"]  # fmt: skip
    print(f"llama.cpp: building llama-cpp-python {version} with CMAKE_ARGS={build.cmake_args!r} "
          "(a CUDA build takes several minutes)", flush=True)  # fmt: skip
    subprocess.run(command, env=build_env, check=True)
    (venv / STAMP).write_text(json.dumps({**asdict(build), "version": version}) + "\n")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pip", default=str(ROOT / ".venv" / "bin" / "pip"))
    parser.add_argument("--venv", default=str(ROOT / ".venv"))
    parser.add_argument("--show", action="store_true", help="print the choice; change nothing")
    args = parser.parse_args(argv)
    env = dict(os.environ)
    try:
        build = choose(env)
    except BuildError as exc:
        print(f"llama.cpp: {exc}", file=sys.stderr)
        return 2
    venv = Path(args.venv)
    where = f"CUDA for architecture {build.architectures}" if build.backend == "cuda" else "the CPU"
    print(f"llama.cpp: building for {where} ({build.reason})", flush=True)
    if args.show:
        print(json.dumps({"wanted": asdict(build), "cmake_args": build.cmake_args,
                          "recorded": recorded(venv)}))  # fmt: skip
        return 0
    try:
        install(build, args.pip, venv, env)
    except subprocess.CalledProcessError as exc:
        print(f"llama.cpp: the build failed (pip exited with {exc.returncode})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
