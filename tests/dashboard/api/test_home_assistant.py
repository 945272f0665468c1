"""Home Assistant's Ollama integration, as it calls the appliance, through the real `ollama`
client: each voice command a new conversation with a ~2,600-token system prompt for a home of
90 entities, the intent tools, keep_alive -1, think false and options.num_ctx 8192, on a chat
key. The appliance is set up with 2048 tokens per sequence (tests/dashboard/api/server.py), so
the first command reloads the model with the 8192 it asks; every command answers, and the warm
ones reuse the shared prefix instead of prefilling it again."""

import ollama
import pytest

from tests.dashboard.api.ha_home import COMMANDS, HA_TOOLS, system_prompt
from tests.dashboard.api.server import STARTER

pytestmark = pytest.mark.model

TAG = f"{STARTER}:latest"
SET_UP_CTX = 2048  # server.SETUP's n_ctx


@pytest.fixture
def home_assistant(appliance) -> ollama.Client:
    return ollama.Client(host=appliance.url, headers=appliance.headers("chat-app"), timeout=300)


def command(client: ollama.Client, text: str) -> ollama.ChatResponse:
    """One voice command, as the integration streams it (entity.py's client.chat call)."""
    parts = list(client.chat(
        model=TAG,
        messages=[{"role": "system", "content": system_prompt()},
                  {"role": "user", "content": text}],
        tools=HA_TOOLS, stream=True, keep_alive=-1, think=False,
        options={"num_ctx": 8192, "num_predict": 4, "temperature": 0},
    ))  # fmt: skip
    assert parts and parts[-1].done, "the stream ended without its done line"
    return parts[-1]


def test_home_assistants_voice_commands_all_answer_and_reuse_the_shared_prefix(home_assistant):
    # Setup: the integration lists the models and asks what is loaded.
    assert TAG in [m.model for m in home_assistant.list().models]
    home_assistant.ps()

    cold, *warm = [command(home_assistant, text) for text in COMMANDS]

    # The prompt is more than the 2048 tokens per sequence the model was loaded with: the
    # first command reloaded it with the num_ctx it sent, and prefilled the whole prompt.
    assert cold.prompt_eval_count > SET_UP_CTX
    assert cold.eval_count >= 1 and cold.done_reason in ("stop", "length")
    # The warm commands share the system prompt and the tools: only what follows is new.
    for done in warm:
        assert done.eval_count >= 1
        assert done.prompt_eval_count < cold.prompt_eval_count / 10, (
            f"a warm command prefilled {done.prompt_eval_count} tokens of a prompt whose "
            f"cold prefill was {cold.prompt_eval_count}"
        )
    (running,) = [m for m in home_assistant.ps().models if m.model == TAG]
    assert running.context_length == 8192


def test_a_smaller_num_ctx_runs_on_the_loaded_context_without_a_reload(home_assistant):
    command(home_assistant, COMMANDS[0])  # loaded with 8192 (or reloaded to it)
    (before,) = [m for m in home_assistant.ps().models if m.model == TAG]

    answer = home_assistant.chat(
        model=TAG, messages=[{"role": "user", "content": "Hi"}],
        options={"num_ctx": 1024, "num_predict": 2},
    )  # fmt: skip

    assert answer.done and answer.load_duration == 0  # no load charged: nothing reloaded
    (after,) = [m for m in home_assistant.ps().models if m.model == TAG]
    assert after.context_length == before.context_length == 8192


def test_a_num_ctx_above_the_training_context_is_clamped_to_it(home_assistant):
    answer = home_assistant.chat(
        model=TAG, messages=[{"role": "user", "content": "Hi"}],
        options={"num_ctx": 1 << 20, "num_predict": 2},
    )  # fmt: skip
    assert answer.done
    (running,) = [m for m in home_assistant.ps().models if m.model == TAG]
    assert running.context_length == home_assistant.show(TAG).modelinfo["llama.context_length"]


def test_show_gives_the_context_setting_and_the_training_context(home_assistant):
    shown = home_assistant.show(TAG)
    assert shown.modelinfo["llama.context_length"] == 8192
    assert f"num_ctx         {SET_UP_CTX}" in shown.parameters.splitlines()
