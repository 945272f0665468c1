"""DELETE /api/delete: admin keys only, never a model that is answering."""

import httpx
import pytest

from tests.dashboard.api.server import STARTER

REGISTER_THROWAWAY = """
from pathlib import Path
from django.conf import settings
from inference.models import LLMModel
path = Path(settings.MODELS_DIR) / "throwaway.gguf"
path.write_bytes(b"GGUF not a real model")
LLMModel.objects.create(name="throwaway", file_path=str(path), size_bytes=path.stat().st_size)
print("PATH", path)
"""


def tag_names(http: httpx.Client, headers: dict) -> list[str]:
    return [m["name"] for m in http.get("/api/tags", headers=headers).json()["models"]]


def test_an_admin_key_deletes_a_model_and_its_file(http, appliance, admin_headers):
    out = appliance.shell(REGISTER_THROWAWAY)
    path = next(line.split(maxsplit=1)[1] for line in out.splitlines() if line.startswith("PATH"))
    assert "throwaway:latest" in tag_names(http, admin_headers)
    response = http.request(
        "DELETE", "/api/delete", json={"model": "throwaway:latest"}, headers=admin_headers
    )
    assert response.status_code == 200, response.text
    assert "throwaway:latest" not in tag_names(http, admin_headers)
    from pathlib import Path

    assert not Path(path).exists()
    again = http.request(
        "DELETE", "/api/delete", json={"model": "throwaway"}, headers=admin_headers
    )
    assert again.status_code == 404


@pytest.mark.model
def test_a_model_that_is_answering_is_not_deleted(http, appliance, admin_headers, chat_headers):
    body = {
        "model": STARTER,
        "prompt": "1, 2, 3, 4, 5,",
        "max_tokens": 600,
        "temperature": 0,
        "stream": True,
    }
    with httpx.Client(base_url=appliance.url, timeout=120) as client:
        with client.stream("POST", "/v1/completions", json=body, headers=chat_headers) as answer:
            assert answer.status_code == 200
            lines = answer.iter_lines()  # kept: a dropped iterator closes the connection
            next(lines)
            refused = http.request(
                "DELETE", "/api/delete", json={"model": STARTER}, headers=admin_headers
            )
    assert refused.status_code == 409
    assert "answering" in refused.json()["error"]
    assert f"{STARTER}:latest" in tag_names(http, admin_headers)
