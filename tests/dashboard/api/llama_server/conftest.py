"""What llama-server's routes' tests share: a POST with the chat app's key."""

import pytest


@pytest.fixture
def post(http, chat_headers):
    """POST a JSON body, check the status (200 unless said) and return the JSON answer."""

    def send(path: str, body: dict, status: int = 200) -> dict:
        answer = http.post(path, json=body, headers=chat_headers)
        assert answer.status_code == status, answer.text
        return answer.json()

    return send
