"""docker-compose.yml and the Dockerfile, read as files: Docker does not run on the test
machines, so the tests check what the files declare, and the other split-mode tests start the
same commands directly."""

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKER_ARGS = ["-A", "appliance", "worker", "-Q", "inference", "-P", "threads"]


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


def test_it_declares_every_process_of_split_mode(services):
    assert set(services) == {"redis", "postgres", "web", "inference", "jobs", "beat"}


def test_the_inference_service_runs_the_command_the_tests_start(services):
    from tests.split.workers import WorkerProcess

    command = services["inference"]["command"]
    assert command[:1] == ["celery"]
    assert _contains(command, WORKER_ARGS)
    assert _contains(command, ["-n", "inference@%h"])
    tested = WorkerProcess.command("test@%h")
    assert _contains(tested, WORKER_ARGS)


def test_the_inference_service_gets_the_gpus_and_the_cuda_build(services):
    inference = services["inference"]
    (device,) = inference["deploy"]["resources"]["reservations"]["devices"]
    assert device == {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}
    assert inference["build"]["args"]["LLAMA_CUDA"] == "1"
    assert inference["image"] != services["web"]["image"]
    assert "DATABASE_URL" not in inference["environment"]  # the worker needs no database


def test_the_web_serves_on_port_8000_with_a_health_check(services):
    web = services["web"]
    assert web["command"] == ["python", "manage.py", "serve"]
    assert web["environment"]["HOST"] == "0.0.0.0"
    assert web["ports"] == ["8000:8000"]
    assert "/healthz" in " ".join(web["healthcheck"]["test"])


def test_every_app_service_uses_redis_and_the_shared_volumes(services):
    for name in ("web", "inference", "jobs", "beat"):
        service = services[name]
        assert service["environment"]["REDIS_URL"] == "${REDIS_URL:-redis://redis:6379/0}", name
        assert service["depends_on"]["redis"]["condition"] == "service_healthy", name
    for name in ("web", "inference", "jobs"):
        assert {"data:/data", "models:/models"} <= set(services[name]["volumes"]), name
    for name in ("web", "jobs", "beat"):
        assert services[name]["environment"]["DATABASE_URL"].startswith("postgres://"), name


def test_every_health_condition_waits_on_a_service_with_a_health_check(services):
    for name, service in services.items():
        for dependency, rule in (service.get("depends_on") or {}).items():
            assert dependency in services, (name, dependency)
            if rule["condition"] == "service_healthy":
                assert "healthcheck" in services[dependency], (name, dependency)


def test_redis_and_postgres_stay_off_the_lan_and_secrets_are_required(services):
    # Whoever reaches Redis can make a worker load any file: it is not published by default.
    assert "ports" not in services["redis"]
    assert "ports" not in services["postgres"]
    assert services["web"]["environment"]["ADMIN_PASSWORD"].startswith("${ADMIN_PASSWORD:?")
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"].startswith(
        "${POSTGRES_PASSWORD:?"
    )


def test_the_top_comment_explains_how_a_second_inference_box_joins():
    head = (ROOT / "docker-compose.yml").read_text().split("\nname:")[0]
    assert "second inference box" in head
    assert "--no-deps inference" in head


def test_the_dockerfile_builds_a_cpu_and_a_cuda_image_on_the_same_python():
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^ARG LLAMA_CUDA=0$", text, re.M)
    for variant in ("0", "1"):
        assert f"AS build-{variant}" in text and f"AS runtime-{variant}" in text
    assert "FROM build-${LLAMA_CUDA} AS build" in text
    assert "FROM runtime-${LLAMA_CUDA} AS runtime" in text
    assert "-DGGML_CUDA=on" in text
    assert "psycopg" in text
    bases = set(re.findall(r"^FROM (\S+)", text, re.M)) - {
        "build-${LLAMA_CUDA}",
        "runtime-${LLAMA_CUDA}",
    }
    assert bases == {"${PYTHON_IMAGE}"}
    assert "/opt/venv" in text


def test_the_image_leaves_out_the_virtualenv_and_the_data():
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", "data", ".git", ".env"} <= set(ignored)


def _contains(sequence: list[str], part: list[str]) -> bool:
    return any(sequence[i : i + len(part)] == part for i in range(len(sequence)))
