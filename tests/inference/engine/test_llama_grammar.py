"""Grammar-constrained sampling on real llama.cpp with the starter model: each sequence samples
through its own grammar, constrained and free requests share one llama_decode, and a grammar
llama.cpp cannot parse is refused at submit."""

import json
import threading

import jsonschema
import pytest

from inference.catalog.starter import starter_model_path
from inference.engine import Engine, SamplingParams
from inference.engine.params import InvalidParams
from inference.text.structured import schema_grammar
from tests.inference.engine.fakes import ask

pytestmark = pytest.mark.model

CHAT = "<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer"},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish"]}, "maxItems": 3},
        "married": {"type": "boolean"},
    },
    "required": ["name", "age", "pets", "married"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def engine(extra_bufts):
    from inference.engine.runner import LlamaRunner
    from inference.engine.runner_config import RunnerConfig

    runner = LlamaRunner(
        RunnerConfig(model_path=str(starter_model_path()), ctx_per_seq=512, parallel=2,
                     n_threads=2, use_extra_bufts=extra_bufts)
    )  # fmt: skip
    engine = Engine(runner, itl_target=0.1).start()
    yield engine
    engine.shutdown()


def answer(engine, prompt: str, params: SamplingParams):
    events = list(engine.submit(ask(prompt, params)).events(timeout=120))
    final = events[-1]
    assert final.type == "done", getattr(final, "message", final)
    return final


def test_a_constrained_answer_parses_and_validates_against_its_schema(engine):
    params = SamplingParams(temperature=0.0, max_tokens=96, grammar=schema_grammar(PERSON))
    done = answer(engine, CHAT.format(question="Describe a person as JSON."), params)
    assert done.finish_reason == "stop"  # the grammar ended it, not max_tokens
    jsonschema.validate(json.loads(done.text), PERSON)


def test_a_sampled_constrained_answer_validates_too(engine):
    params = SamplingParams(temperature=1.2, top_k=0, top_p=1.0, min_p=0.0, seed=7,
                            max_tokens=96, grammar=schema_grammar(PERSON))  # fmt: skip
    done = answer(engine, CHAT.format(question="Tell me a story."), params)
    assert done.finish_reason == "stop"
    jsonschema.validate(json.loads(done.text), PERSON)


def test_a_constrained_and_a_free_request_run_in_the_same_decode(engine, monkeypatch):
    steps: list[set[str]] = []
    real_execute = engine.runner.execute

    def watched(chunks):  # a spy: the real llama_decode still runs
        steps.append({c.request.id for c in chunks if c.sample})
        return real_execute(chunks)

    monkeypatch.setattr(engine.runner, "execute", watched)
    free_params = SamplingParams(temperature=0.0, max_tokens=40)
    free_prompt = CHAT.format(question="Write two sentences about rivers.")
    free_alone = answer(engine, free_prompt, free_params)
    constrained = SamplingParams(temperature=0.0, max_tokens=96, grammar=schema_grammar(PERSON))
    handles = {}
    results = {}

    def run(name, prompt, params):
        handle = handles[name] = engine.submit(ask(prompt, params))
        for event in handle.events(timeout=120):
            results[name] = event

    threads = [
        threading.Thread(target=run, args=("free", free_prompt, free_params)),
        threading.Thread(target=run, args=(
            "json", CHAT.format(question="Describe a person as JSON."), constrained)),
    ]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert results["json"].type == results["free"].type == "done"
    jsonschema.validate(json.loads(results["json"].text), PERSON)
    # The free answer is untouched by its neighbour's grammar...
    assert results["free"].text[:60] == free_alone.text[:60]
    # ...and the two were sampled from the same llama_decode calls.
    both = {handles["free"].id, handles["json"].id}
    assert any(both <= step for step in steps)


def test_a_grammar_llama_cpp_cannot_parse_is_refused_at_submit(engine):
    with pytest.raises(InvalidParams) as refused:
        engine.submit(ask("hi", SamplingParams(grammar="root ::= undefined-rule")))
    assert refused.value.field == "grammar"
    assert "failed to parse grammar" in str(refused.value)
    with pytest.raises(InvalidParams, match="defines no root rule"):
        engine.submit(ask("hi", SamplingParams(grammar='answer ::= "yes"')))
    # The engine goes on serving.
    assert answer(engine, "Hello", SamplingParams(temperature=0.0, max_tokens=4)).text


def test_a_lazy_grammar_leaves_the_text_free_until_its_trigger_token(engine):
    # " the" is one token of this vocabulary: the text before it is free, and from it on the
    # answer follows the grammar (" the", a space, digits), then ends.
    prompt = CHAT.format(question="Tell me about the sun.")
    free = answer(engine, prompt, SamplingParams(temperature=0.0, max_tokens=24))
    assert " the" in free.text  # the free answer reaches the trigger
    params = SamplingParams(temperature=0.0, max_tokens=24, grammar='root ::= " the " [0-9]+',
                            grammar_triggers=(" the",))  # fmt: skip
    done = answer(engine, prompt, params)
    head, sep, tail = done.text.partition(" the ")
    assert head == free.text.partition(" the")[0]
    assert sep and tail.isdigit(), done.text


def test_a_trigger_that_is_not_one_token_leaves_the_answer_free(engine):
    prompt = CHAT.format(question="Tell me about the moon.")
    free = answer(engine, prompt, SamplingParams(temperature=0.0, max_tokens=16))
    params = SamplingParams(temperature=0.0, max_tokens=16, grammar='root ::= "x"',
                            grammar_triggers=("the moon is",))  # fmt: skip
    assert answer(engine, prompt, params).text == free.text


@pytest.mark.parametrize(
    ("field", "value"),
    [("grammar", ""), ("grammar", "x" * 70_000), ("grammar", "root ::= \"\0\""),
     ("grammar", "root ::= " + "(" * 20_000),  # would overflow llama.cpp's parser's stack
     ("grammar_triggers", ("x",))],
)  # fmt: skip
def test_malformed_grammars_are_refused_before_reaching_llama_cpp(field, value):
    with pytest.raises(InvalidParams) as refused:
        SamplingParams(**{field: value})
    assert refused.value.field == field
