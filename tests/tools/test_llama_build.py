"""`make install`'s choice of llama.cpp build (tools/llama_build.py), run as the Makefile runs it,
with fake nvidia-smi, nvcc and pip on PATH: CUDA for the local card only when a compiler and a
card are both here, the CPU otherwise, and a rebuild whenever the build changes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "llama_build.py"


def fake(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)


@pytest.fixture
def box(tmp_path):
    """A PATH with only what a test puts there, and no CUDA_HOME to fall back on."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    venv = tmp_path / "venv"
    venv.mkdir()
    env = {"PATH": str(bin_dir), "CUDA_HOME": str(tmp_path / "no-cuda"), "HOME": str(tmp_path)}
    return bin_dir, venv, env


def nvcc(bin_dir: Path) -> None:
    fake(bin_dir, "nvcc", 'echo "Cuda compilation tools, release 13.0, V13.0.88"')


def card(bin_dir: Path, *lines: str) -> None:
    printed = "\n".join(lines)
    fake(bin_dir, "nvidia-smi", f'[ "$1" = "--list-gpus" ] && exit 0\nprintf "{printed}\\n"')


def recording_pip(bin_dir: Path, log: Path) -> Path:
    fake(bin_dir, "pip", f'echo "$CMAKE_ARGS|$CUDACXX|$*" >> {log}')
    return bin_dir / "pip"


def show(env: dict, venv: Path, **extra: str) -> dict:
    command = [sys.executable, str(SCRIPT), "--show", "--venv", str(venv)]
    done = subprocess.run(command, env={**env, **extra}, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def run(env: dict, venv: Path, pip: Path, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--pip", str(pip), "--venv", str(venv)],
                          env={**env, **extra}, capture_output=True, text=True)  # fmt: skip


def test_a_compiler_without_a_card_builds_for_the_cpu(box):
    bin_dir, venv, env = box
    nvcc(bin_dir)  # this development box: nvcc installed, no driver, no card
    chosen = show(env, venv)
    assert chosen["wanted"]["backend"] == "cpu"
    assert chosen["cmake_args"] == "-DGGML_CUDA=off"
    assert "nvidia-smi is not installed" in chosen["wanted"]["reason"]


def test_a_card_whose_driver_does_not_answer_builds_for_the_cpu(box):
    bin_dir, venv, env = box
    nvcc(bin_dir)
    fake(bin_dir, "nvidia-smi", 'echo "NVIDIA-SMI has failed because it couldn\'t communicate '
         'with the NVIDIA driver."; exit 9')  # fmt: skip
    chosen = show(env, venv)
    assert chosen["wanted"]["backend"] == "cpu"
    assert "does not answer" in chosen["wanted"]["reason"]


def test_a_compiler_and_a_card_build_cuda_for_that_card_only(box):
    bin_dir, venv, env = box
    nvcc(bin_dir)
    card(bin_dir, "9.0, NVIDIA H200")
    chosen = show(env, venv)
    assert chosen["wanted"]["backend"] == "cuda"
    assert chosen["cmake_args"] == "-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90"
    assert "NVIDIA H200 (compute capability 9.0)" in chosen["wanted"]["reason"]


def test_two_different_cards_build_for_both_architectures_once_each(box):
    bin_dir, venv, env = box
    nvcc(bin_dir)
    card(bin_dir, "8.9, NVIDIA GeForce RTX 4060", "8.6, NVIDIA RTX A2000", "8.9, NVIDIA L4")
    assert show(env, venv)["wanted"]["architectures"] == "86;89"


def test_a_card_without_a_compiler_builds_for_the_cpu_and_says_why(box):
    bin_dir, venv, env = box
    card(bin_dir, "8.6, NVIDIA GeForce RTX 3060")
    chosen = show(env, venv)
    assert chosen["wanted"]["backend"] == "cpu"
    assert "no CUDA compiler (nvcc)" in chosen["wanted"]["reason"]


def test_a_compiler_in_cuda_home_counts_when_it_is_not_on_path(box, tmp_path):
    bin_dir, venv, env = box
    home = tmp_path / "cuda-13.0"
    (home / "bin").mkdir(parents=True)
    nvcc(home / "bin")
    card(bin_dir, "9.0, NVIDIA H200")
    chosen = show(env, venv, CUDA_HOME=str(home))
    assert chosen["wanted"]["nvcc"] == str(home / "bin" / "nvcc")


def test_llama_gpu_cpu_builds_for_the_cpu_whatever_is_here(box):
    bin_dir, venv, env = box
    nvcc(bin_dir)
    card(bin_dir, "9.0, NVIDIA H200")
    assert show(env, venv, LLAMA_GPU="cpu")["wanted"]["backend"] == "cpu"


def test_llama_gpu_cuda_without_a_compiler_stops_and_says_what_is_missing(box):
    bin_dir, venv, env = box
    card(bin_dir, "9.0, NVIDIA H200")
    done = run(env, venv, bin_dir / "pip", LLAMA_GPU="cuda")
    assert done.returncode == 2
    assert "no CUDA compiler (nvcc)" in done.stderr


def test_llama_gpu_cuda_without_a_card_needs_the_architecture_named(box):
    bin_dir, venv, env = box
    nvcc(bin_dir)
    assert "LLAMA_CUDA_ARCH" in run(env, venv, bin_dir / "pip", LLAMA_GPU="cuda").stderr
    chosen = show(env, venv, LLAMA_GPU="cuda", LLAMA_CUDA_ARCH="89")
    assert chosen["cmake_args"] == "-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=89"


def test_an_unknown_llama_gpu_value_is_refused_by_name(box):
    bin_dir, venv, env = box
    done = run(env, venv, bin_dir / "pip", LLAMA_GPU="gpu")
    assert done.returncode == 2 and "LLAMA_GPU must be one of auto, cuda, cpu" in done.stderr


def test_a_cpu_box_leaves_the_install_to_pip_as_before(box, tmp_path):
    bin_dir, venv, env = box
    log = tmp_path / "pip.log"
    pip = recording_pip(bin_dir, log)
    assert run(env, venv, pip).returncode == 0
    assert not log.exists() and not (venv / "llama-build.json").exists()


def test_cuda_is_built_from_source_past_pips_wheel_cache_once(box, tmp_path):
    bin_dir, venv, env = box
    nvcc(bin_dir)
    card(bin_dir, "9.0, NVIDIA H200")
    log = tmp_path / "pip.log"
    pip = recording_pip(bin_dir, log)

    assert run(env, venv, pip).returncode == 0
    cmake_args, cudacxx, args = log.read_text().splitlines()[0].split("|")
    assert cmake_args == "-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90"
    assert cudacxx == str(bin_dir / "nvcc")
    for flag in ("--no-cache-dir", "--force-reinstall", "--no-binary llama-cpp-python"):
        assert flag in args
    assert "llama-cpp-python==0.3.36" in args
    assert json.loads((venv / "llama-build.json").read_text())["backend"] == "cuda"

    assert run(env, venv, pip).returncode == 0  # the same build again: nothing to do
    assert len(log.read_text().splitlines()) == 1


def test_going_back_to_the_cpu_rebuilds_without_cuda(box, tmp_path):
    bin_dir, venv, env = box
    nvcc(bin_dir)
    card(bin_dir, "9.0, NVIDIA H200")
    log = tmp_path / "pip.log"
    pip = recording_pip(bin_dir, log)
    run(env, venv, pip)

    assert run(env, venv, pip, LLAMA_GPU="cpu").returncode == 0
    assert log.read_text().splitlines()[-1].startswith("-DGGML_CUDA=off|")
    assert json.loads((venv / "llama-build.json").read_text())["backend"] == "cpu"


def test_a_failed_build_records_nothing(box, tmp_path):
    bin_dir, venv, env = box
    nvcc(bin_dir)
    card(bin_dir, "9.0, NVIDIA H200")
    fake(bin_dir, "pip", "exit 1")
    done = run(env, venv, bin_dir / "pip")
    assert done.returncode == 1 and "the build failed" in done.stderr
    assert not (venv / "llama-build.json").exists()


def test_the_makefile_runs_the_choice_before_installing_the_project():
    makefile = (SCRIPT.parents[1] / "Makefile").read_text()
    for target in ("install:", "install-test:"):
        recipe = makefile.split("\n" + target, 1)[1].split("\n\n", 1)[0]
        lines = [line.strip() for line in recipe.splitlines()[1:]]
        assert "tools/llama_build.py" in lines[0] and "install -e" in lines[1]
    assert "LLAMA_GPU ?= auto" in makefile
    assert os.access(SCRIPT, os.R_OK)
