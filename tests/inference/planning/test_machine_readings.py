"""The box's GPU readings through NVML (a fake one, with recorded cards): per card its memory,
load, temperature and power, and the memory of our own processes on it; a box without NVML has
no readings at all, never zeros."""

import os

from inference.planning.machine import free_gpu_bytes, gpu_readings, system_readings
from tests.inference.planning.nvml import MiB, h200, installed, laptop_4gb, rtx_3060

RUNNER = 4242


def test_a_box_without_a_gpu_has_no_readings(monkeypatch):
    installed(monkeypatch)
    assert gpu_readings() == []
    assert system_readings()["gpus"] == [] and free_gpu_bytes([]) is None


def test_a_card_reads_its_memory_load_temperature_and_power(monkeypatch):
    installed(monkeypatch, h200(used_bytes=2048 * MiB, utilization=37, temperature_c=41,
                                power_mw=123_456))  # fmt: skip
    (card,) = gpu_readings()
    assert card["name"] == "NVIDIA H200" and card["total_bytes"] == 143771 * MiB
    assert card["used_bytes"] == 2048 * MiB and card["visible"] is True
    assert (card["utilization"], card["temperature_c"]) == (37, 41)
    assert card["power_w"] == 123.456 and card["power_limit_w"] == 700.0


def test_only_our_processes_are_counted_and_each_is_named_by_pid(monkeypatch):
    installed(monkeypatch, rtx_3060(processes={RUNNER: 900 * MiB, 777: 3000 * MiB}))
    (card,) = gpu_readings({os.getpid(), RUNNER})
    assert card["processes"] == [{"pid": RUNNER, "bytes": 900 * MiB}]
    assert card["process_bytes"] == 900 * MiB


def test_a_container_without_per_process_counts_says_it_cannot_tell(monkeypatch):
    installed(monkeypatch, h200(processes={RUNNER: None}))
    (card,) = gpu_readings({RUNNER})
    assert card["processes"] == [{"pid": RUNNER, "bytes": None}]
    assert card["process_bytes"] == 0


def test_a_card_without_power_readings_reports_none_rather_than_zero(monkeypatch):
    installed(monkeypatch, laptop_4gb(temperature_c=None))
    (card,) = gpu_readings()
    assert card["power_w"] is None and card["power_limit_w"] is None
    assert card["temperature_c"] is None and card["utilization"] == 0


def test_free_memory_counts_only_the_cards_llama_cpp_may_use(monkeypatch):
    installed(monkeypatch, rtx_3060(used_bytes=288 * MiB), h200())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    readings = gpu_readings()
    assert [g["visible"] for g in readings] == [True, False]
    assert free_gpu_bytes(readings) == 12000 * MiB
