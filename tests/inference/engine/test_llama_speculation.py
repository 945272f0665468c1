"""Speculation on real llama.cpp with the real small model: at temperature 0 every answer is
token for token the one without speculation (an edit, a JSON list, prose), a grammar's answer
too, and drafts were really verified on the way."""

import json

import pytest

from inference.engine import Engine, GenerationRequest, SamplingParams
from inference.engine.speculation.policy import Speculation

pytestmark = pytest.mark.model

CHAT = "<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"
PARAGRAPH = ("The kitchen light is blue. The hall light is blue and bright. In the garage "
             "the light is blue as well, and the attic has a blue lamp next to the window.")
TASKS = {
    "edit": CHAT.format(q="Repeat this text exactly, but write green instead of blue:\n"
                        + PARAGRAPH),  # fmt: skip
    "json": CHAT.format(q="The devices are: kitchen light, hall light, garage door, attic fan, "
                        "porch lamp, cellar pump. Answer with a JSON array of their names."),
    "prose": CHAT.format(q="Write a short story about the sea."),
}
# A JSON array of lowercase names, as a GBNF grammar.
NAMES = 'root ::= "[" item ("," " "? item){0,7} "]"\nitem ::= "\\"" [a-z ]{1,24} "\\""'



def answers(starter_path, extra_bufts, mode: str | None, params: SamplingParams) -> dict:
    from inference.engine.runner import LlamaRunner
    from inference.engine.runner_config import RunnerConfig

    runner = LlamaRunner(RunnerConfig(model_path=str(starter_path), ctx_per_seq=1024,
                                      parallel=1, cache_slots=0, n_threads=2,
                                      use_extra_bufts=extra_bufts))  # fmt: skip
    speculation = Speculation(mode, max_draft=4) if mode else None
    engine = Engine(runner, itl_target=1.0, speculation=speculation).start()
    try:
        done = {}
        for name, prompt in TASKS.items():
            events = engine.submit(GenerationRequest(prompt, params)).events(timeout=600)
            done[name] = list(events)[-1]
        return done
    finally:
        engine.shutdown()


def test_greedy_answers_are_the_same_with_and_without_speculation(starter_path, extra_bufts):
    params = SamplingParams(temperature=0, max_tokens=96)
    plain = answers(starter_path, extra_bufts, None, params)
    fast = answers(starter_path, extra_bufts, "always", params)
    for name in TASKS:
        assert fast[name].text == plain[name].text, name
    assert fast["json"].figures["draft_accepted"] > 10  # the list repeats its prompt's names
    assert sum(d.figures["drafted"] for d in fast.values()) > 30


def test_a_grammars_answer_is_valid_and_the_same_with_speculation(starter_path, extra_bufts):
    params = SamplingParams(temperature=0, max_tokens=200, grammar=NAMES)
    plain = answers(starter_path, extra_bufts, None, params)["json"]
    fast = answers(starter_path, extra_bufts, "always", params)["json"]
    assert fast.text == plain.text and fast.finish_reason == "stop"
    names = json.loads(fast.text)
    assert isinstance(names, list) and all(isinstance(n, str) for n in names)
    assert fast.figures["draft_accepted"] > 0
