"""JSON schemas as grammars: what the converter cannot enforce is refused by name, the web
process never loads llama.cpp to convert, and (a property, on the real model) whatever the
grammar lets the model write parses and validates against the schema."""

import json
import subprocess
import sys

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema

from dashboard.api.tools import CLOSE, OPEN, ToolCallParser
from inference.catalog.starter import starter_model_path
from inference.engine import Engine, SamplingParams
from inference.text.structured import (
    MAX_STRING_LENGTH,
    UnsupportedSchema,
    json_object_grammar,
    schema_grammar,
    tool_call_grammar,
)
from tests.inference.engine.fakes import ask

# (the schema, what the refusal must name)
UNSUPPORTED = [
    ({"type": "integer", "minimum": 1}, "minimum"),
    ({"type": "number", "multipleOf": 0.5}, "multipleOf"),
    ({"type": "object", "patternProperties": {"^x": {}}}, "patternProperties"),
    ({"if": {"type": "string"}, "then": {"maxLength": 2}}, "if/then/else"),
    ({"not": {"type": "string"}}, "not"),
    ({"$ref": "https://example.com/schema.json"}, "$ref to 'https://example.com/schema.json'"),
    ({"type": "object", "properties": {"next": {"$ref": "#"}}}, "the recursive $ref '#'"),
    ({"type": "string", "format": "email"}, "format 'email'"),
    ({"type": "string", "pattern": "^\\d+$"}, "pattern that may escape only"),
    ({"type": "string", "pattern": "[a-z]+"}, "pattern that must be anchored"),
    ({"type": "string", "format": "date", "maxLength": 4}, "maxLength beside format"),
    ({"type": "array", "items": {}, "uniqueItems": True}, "uniqueItems"),
    ({"type": "object", "properties": {}, "minProperties": 1}, "minProperties"),
    ({"type": "object", "properties": {"a": {}}, "required": ["b"]}, "required names not in"),
    ({"anyOf": [{"type": "string"}], "type": "string"}, "type beside anyOf"),
    ({"enum": ['say "hi"']}, "enum strings with quotes"),
]


@pytest.mark.parametrize(("schema", "named"), UNSUPPORTED, ids=[u[1] for u in UNSUPPORTED])
def test_a_keyword_the_grammar_cannot_enforce_is_refused_by_name(schema, named):
    with pytest.raises(UnsupportedSchema, match="cannot enforce") as refused:
        schema_grammar(schema)
    assert named in str(refused.value)


def test_the_refusal_says_where_the_keyword_is_and_lists_every_one():
    schema = {"type": "object", "properties": {"age": {"type": "integer", "maximum": 150},
                                               "tags": {"type": "array", "contains": {}}}}
    with pytest.raises(UnsupportedSchema) as refused:
        schema_grammar(schema)
    message = str(refused.value)
    assert "maximum (at /properties/age)" in message
    assert "contains (at /properties/tags)" in message


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "integer", "maxLength": 3},  # a string keyword on an integer constrains nothing
        {"type": ["string", "null"], "maxLength": 5},
        {"type": "object", "properties": {"a": {"$ref": "#/$defs/flag"}},
         "$defs": {"flag": {"type": "boolean", "description": "annotations are fine"}}},
        {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                   {"properties": {"b": {"const": "x"}}}]},
        {"type": "string", "pattern": "^[a-z]{2,4}(-[0-9]+)?$"},
        {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}],
         "items": False},
        {"x-vendor-extension": 1, "type": "object", "properties": {"a": {"type": "number"}}},
    ],
)  # fmt: skip
def test_what_the_grammar_enforces_converts(schema):
    assert "root ::=" in schema_grammar(schema)


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"type": "string", "maxLength": MAX_STRING_LENGTH + 1}, "maxLength"),
        ({"type": "array", "items": {}, "maxItems": 10_000}, "maxItems"),
        ({"properties": {"a" * 70_000: {}}}, "characters"),
        ({"type": "wizard"}, "type"),
        ({"anyOf": []}, "anyOf"),
        ({"$ref": "#/$defs/missing"}, "names nothing"),
    ],
)
def test_oversized_and_malformed_schemas_are_refused(schema, message):
    with pytest.raises(UnsupportedSchema, match=message):
        schema_grammar(schema)


def test_deeply_nested_schemas_are_refused_without_recursing_forever():
    schema: dict = {"type": "string"}
    for _ in range(200):
        schema = {"type": "array", "items": schema}
    with pytest.raises(UnsupportedSchema, match="nests deeper"):
        schema_grammar(schema)


def test_converting_never_loads_llama_cpp_into_the_process():
    code = (
        "import sys; from inference.text.structured import schema_grammar;"
        "schema_grammar({'type': 'object', 'properties': {'a': {'type': 'integer'}}});"
        "print([m for m in sys.modules if m.startswith('llama_cpp')])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- on the real model ---------------------------------------------------------------------

CHAT = "<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def engine(extra_bufts):
    from inference.engine.runner import LlamaRunner
    from inference.engine.runner_config import RunnerConfig

    runner = LlamaRunner(
        RunnerConfig(model_path=str(starter_model_path()), ctx_per_seq=1024, parallel=1,
                     n_threads=2, use_extra_bufts=extra_bufts)
    )  # fmt: skip
    engine = Engine(runner, itl_target=0.1).start()
    yield engine
    engine.shutdown()


def generate(engine, question: str, params: SamplingParams):
    events = list(engine.submit(ask(CHAT.format(question=question), params)).events(timeout=120))
    assert events[-1].type == "done", events[-1]
    return events[-1]


# The schemas of the property: drawn by hypothesis-jsonschema from a schema of schemas that keep
# every answer short (strings of at most 8 characters, at most 3 items and 3 properties), so
# that an answer always ends within max_tokens.
NAME = {"type": "string", "pattern": "^[a-z]{1,8}$"}
LEAF = {"anyOf": [
    {"type": "object", "properties": {"type": {"const": "string"},
                                      "maxLength": {"type": "integer", "minimum": 0,
                                                    "maximum": 8}},
     "required": ["type", "maxLength"], "additionalProperties": False},
    {"type": "object", "properties": {"type": {"enum": ["integer", "boolean", "null"]}},
     "required": ["type"], "additionalProperties": False},
    {"type": "object", "properties": {"enum": {"type": "array", "items": NAME, "minItems": 1,
                                               "maxItems": 4, "uniqueItems": True}},
     "required": ["enum"], "additionalProperties": False},
]}  # fmt: skip
ARRAY = {"type": "object", "properties": {
    "type": {"const": "array"}, "items": LEAF,
    "minItems": {"type": "integer", "minimum": 0, "maximum": 1},
    "maxItems": {"type": "integer", "minimum": 1, "maximum": 3},
}, "required": ["type", "items", "maxItems"], "additionalProperties": False}  # fmt: skip
OBJECT = {"type": "object", "properties": {
    "type": {"const": "object"},
    "properties": {"type": "object", "propertyNames": NAME, "additionalProperties":
                   {"anyOf": [LEAF, ARRAY]}, "minProperties": 1, "maxProperties": 3},
    "additionalProperties": {"const": False},
}, "required": ["type", "properties", "additionalProperties"],
    "additionalProperties": False}  # fmt: skip


@st.composite
def answer_schemas(draw) -> dict:
    schema = draw(from_schema(OBJECT))
    names = sorted(schema["properties"])
    required = draw(st.lists(st.sampled_from(names), unique=True))
    return {**schema, "required": required}


@settings(max_examples=12, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(schema=answer_schemas(), seed=st.integers(0, 2**32 - 1))  # fmt: skip
def test_constrained_output_always_parses_and_validates(engine, schema, seed):
    params = SamplingParams(temperature=1.0, seed=seed, max_tokens=320,
                            grammar=schema_grammar(schema))  # fmt: skip
    done = generate(engine, "Describe your day as JSON.", params)
    assert done.finish_reason == "stop", done.text  # the grammar ended it
    jsonschema.validate(json.loads(done.text), schema)


def test_json_mode_gives_a_json_object(engine):
    params = SamplingParams(temperature=0.0, max_tokens=200, grammar=json_object_grammar())
    done = generate(engine, "Give me a JSON object with your name.", params)
    assert done.finish_reason == "stop", done.text
    assert isinstance(json.loads(done.text), dict)


def test_numbers_dates_and_tuples_come_out_as_their_schema_says(engine):
    schema = {"type": "object", "properties": {
        "price": {"type": "number"}, "when": {"type": "string", "format": "date"},
        "pair": {"type": "array", "prefixItems": [{"type": "integer"}, {"const": "eur"}]},
        "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
    }, "required": ["price", "when", "pair", "code"]}  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=160, grammar=schema_grammar(schema))
    done = generate(engine, "Tell me the price of bread as JSON.", params)
    assert done.finish_reason == "stop", done.text
    jsonschema.validate(json.loads(done.text), schema)


def test_a_tool_call_grammar_holds_each_calls_arguments_to_its_tools_schema(engine):
    light = {"type": "object", "properties": {"room": {"enum": ["kitchen", "hall"]},
                                              "on": {"type": "boolean"}},
             "required": ["room", "on"], "additionalProperties": False}  # fmt: skip
    odd = {"type": "object", "patternProperties": {"^x": {}}}  # outside the subset: any object
    grammar = tool_call_grammar([("set_light", light), ("odd", odd)], OPEN, CLOSE, parallel=False)
    # Applied from the first token (not lazily), it makes the model write a call, which the
    # API's parser must recognise.
    done = generate(engine, "Turn on the kitchen light.",
                    SamplingParams(temperature=0.0, max_tokens=120, grammar=grammar))
    assert done.finish_reason == "stop", done.text
    parser = ToolCallParser({"set_light", "odd"})
    rest = parser.feed(done.text)
    tail, calls = parser.finish()
    assert (rest + tail).strip() == "" and len(calls) == 1, done.text
    if calls[0].name == "set_light":
        jsonschema.validate(calls[0].arguments, light)
    else:
        assert isinstance(calls[0].arguments, dict)
