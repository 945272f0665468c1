"""Structured output: JSON schemas (and JSON mode) as GBNF grammars for the engine.

The converter is llama-cpp-python's (llama_cpp/llama_grammar.py, its copy of llama.cpp's
json-schema-to-grammar). It is loaded from its file alone: importing the llama_cpp package would
map libllama into the web process, which only runner processes may do.

The converter quietly drops what it cannot express (a `minimum`, `patternProperties`, a
`maxLength` beside a `format`, ...), and a grammar without them lets through output the schema
forbids. So a schema is first rewritten into the subset the converter honours, keyword by
keyword, and anything outside it is refused with an error that names the keywords and where they
are (`UnsupportedSchema`):

1. Bounds: the schema's size, nesting depth and node count; string lengths, item counts.
2. Local `$ref`s (`#/...`) are inlined (a recursive or remote one is refused); a list of types
   becomes an `anyOf` of one type each (exact: every other keyword applies to one type only).
3. Each node is matched to the converter's branch for it (the order of its `visit`), and every
   validation keyword that branch ignores is reported; annotations (title, description, ...)
   and keywords outside the JSON Schema vocabulary are ignored, as JSON Schema says.
4. The converted grammar must fit the engine's limit (MAX_GRAMMAR_CHARS).

`oneOf` is held as `anyOf` (the output matches at least one branch), as llama.cpp does.
"""

import functools
import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

from inference.engine.params import MAX_GRAMMAR_CHARS

MAX_SCHEMA_CHARS = 64 * 1024
MAX_SCHEMA_DEPTH = 24
MAX_SCHEMA_NODES = 2000  # after $refs are inlined
MAX_STRING_LENGTH = 1000  # minLength / maxLength: the grammar spells out every position
MAX_ARRAY_ITEMS = 100  # minItems / maxItems, for the same reason
MAX_ENUM_VALUES = 500
MAX_LISTED = 8  # unsupported keywords named in one error

ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "$comment", "$schema", "$id", "$anchor",
    "deprecated", "readOnly", "writeOnly", "$defs", "definitions", "nullable", "discriminator",
    "contentEncoding", "contentMediaType", "$vocabulary",
})  # fmt: skip
# The JSON Schema validation vocabulary (drafts 4 to 2020-12): a keyword here that a node's
# branch does not honour is refused; anything else is an annotation.
VALIDATION = frozenset({
    "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum",
    "exclusiveMinimum", "maxLength", "minLength", "pattern", "maxItems", "minItems",
    "uniqueItems", "maxContains", "minContains", "maxProperties", "minProperties", "required",
    "dependentRequired", "dependencies", "properties", "patternProperties",
    "additionalProperties", "propertyNames", "items", "prefixItems", "additionalItems",
    "contains", "unevaluatedItems", "unevaluatedProperties", "allOf", "anyOf", "oneOf", "not",
    "if", "then", "else", "dependentSchemas", "$ref", "$dynamicRef", "$recursiveRef", "format",
    "contentSchema",
})  # fmt: skip
# Keywords that constrain one type only: beside another `type` they constrain nothing.
_FOR_TYPE = {
    "string": {"minLength", "maxLength", "pattern", "format", "contentSchema"},
    "number": {"multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum"},
    "array": {"items", "prefixItems", "additionalItems", "maxItems", "minItems", "uniqueItems",
              "contains", "maxContains", "minContains", "unevaluatedItems"},
    "object": {"properties", "patternProperties", "additionalProperties", "required",
               "maxProperties", "minProperties", "dependentRequired", "dependencies",
               "propertyNames", "dependentSchemas", "unevaluatedProperties"},
}  # fmt: skip
TYPES = ("string", "number", "integer", "boolean", "null", "object", "array")
FORMATS = frozenset({"date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4",
                     "uuid5"})  # fmt: skip
_PYTHON_TYPES = {"string": (str,), "number": (int, float), "integer": (int,),
                 "boolean": (bool,), "null": (type(None),), "object": (dict,), "array": (list,)}
# What a pattern may use: the converter turns only plain regular expressions into GBNF.
_PATTERN_ESCAPABLE = set("[](){}*+?|")


class UnsupportedSchema(ValueError):
    """A JSON schema this engine cannot enforce; the message names what and where."""


def _load_converter() -> ModuleType:
    spec = importlib.util.find_spec("llama_cpp")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("llama-cpp-python is not installed: no JSON schema converter")
    path = Path(next(iter(spec.submodule_search_locations))) / "llama_grammar.py"
    module_spec = importlib.util.spec_from_file_location("appliance_llama_grammar", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    # Its string characters admit raw control characters, which JSON forbids inside strings
    # (llama.cpp's newer converter excludes them the same way); its "." and classes are kept
    # from quotes and backslashes by the pattern check below.
    module.PRIMITIVE_RULES["char"] = module.BuiltinRule(
        r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] '
        r"[0-9a-fA-F])",
        [],
    )
    module.DOT = r'[^"\\\x7F\x00-\x1F]'
    return module


@functools.cache
def _converter() -> ModuleType:
    return _load_converter()


def _pointer(root: Any, ref: str) -> Any:
    """The node a local `#/a/b` reference names (JSON Pointer escapes included), or KeyError."""
    node = root
    for raw in ref[1:].split("/")[1:] if ref not in ("#", "#/") else []:
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise KeyError(ref)
    return node


def _plain_text(value: Any) -> bool:
    """Strings the converter writes into GBNF literals (property names, enum and const values)
    must not need JSON escapes: its literal escaping gets backslashes and control characters
    wrong."""
    if isinstance(value, str):
        return not any(c in '"\\' or ord(c) < 0x20 or ord(c) == 0x7F or ord(c) > 0xFFFF
                       for c in value)  # fmt: skip
    if isinstance(value, list):
        return all(_plain_text(v) for v in value)
    if isinstance(value, dict):
        return all(_plain_text(k) and _plain_text(v) for k, v in value.items())
    return True


def _count(name: str, value: Any, path: str, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
        raise UnsupportedSchema(f"{name} at {path or '/'} must be an integer from 0 to {high}")
    return value


def _pattern_problem(pattern: Any) -> str | None:
    if not isinstance(pattern, str):
        return "must be a string"
    if not (pattern.startswith("^") and pattern.endswith("$")) or len(pattern) < 2:
        return "must be anchored with ^ and $"
    try:
        re.compile(pattern)
    except re.error as exc:
        return f"is not a regular expression ({exc})"
    body = pattern[1:-1]
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in body):
        return "must not hold control characters"
    if "(?" in body:
        return "must not use (?...) groups or lookarounds"
    if '"' in body or "[^" in body:
        return "must not use quotes or negated classes [^...]"
    in_class = False
    for i, char in enumerate(body):
        if char == "\\":
            following = body[i + 1 : i + 2]
            if in_class or following not in _PATTERN_ESCAPABLE:
                return "may escape only []{}()*+?| (no \\d, \\w, \\s, ...)"
        elif char == "[" and (i == 0 or body[i - 1] != "\\"):
            in_class = True
        elif char == "]" and (i == 0 or body[i - 1] != "\\"):
            in_class = False
        elif char in "^$" and not in_class:
            return "may use ^ and $ only at its ends"
    return None


class _Normaliser:
    """One schema's rewrite (steps 2 and 3 of the module docstring)."""

    def __init__(self, root: dict):
        self.root = root
        self.unsupported: list[str] = []
        self.nodes = 0
        self.active_refs: list[str] = ["#"]

    def refuse(self, what: str, path: str) -> None:
        entry = f"{what} (at {path or '/'})"
        if entry not in self.unsupported:
            self.unsupported.append(entry)

    def schema(self, node: Any, path: str, depth: int = 0) -> dict:
        self.nodes += 1
        if self.nodes > MAX_SCHEMA_NODES:
            raise UnsupportedSchema(f"the schema has over {MAX_SCHEMA_NODES} nodes once its "
                                    "$refs are inlined")  # fmt: skip
        if depth > MAX_SCHEMA_DEPTH:
            raise UnsupportedSchema(f"the schema nests deeper than {MAX_SCHEMA_DEPTH} levels")
        if node is True:
            node = {}
        if not isinstance(node, dict):
            raise UnsupportedSchema(f"{path or '/'} must be a schema (a JSON object)"
                                    + (": false schemas are not supported" if node is False
                                       else ""))  # fmt: skip
        keys = {k for k in node if k in VALIDATION}
        if "$ref" in keys:
            return self._ref(node, keys, path, depth)
        kind = node.get("type")
        if isinstance(kind, list):
            if not kind or any(t not in TYPES for t in kind) or len(set(kind)) != len(kind):
                raise UnsupportedSchema(f"type at {path or '/'} must name JSON types, once each")
            if len(kind) > 1:
                rest = {k: v for k, v in node.items() if k != "type"}
                return self.schema({"anyOf": [{**rest, "type": t} for t in kind]}, path, depth)
            node, kind = {**node, "type": kind[0]}, kind[0]
        if kind is not None and kind not in TYPES:
            raise UnsupportedSchema(f"type at {path or '/'} must be one of {', '.join(TYPES)}")
        if kind is not None:
            own = _FOR_TYPE.get("number" if kind == "integer" else kind, set())
            keys -= set().union(*_FOR_TYPE.values()) - own
        for branch in (self._union, self._constant, self._object, self._all_of, self._array,
                       self._string):  # fmt: skip
            result = branch(node, kind, keys, path, depth)
            if result is not None:
                return result
        return self._primitive(node, kind, keys, path)

    def _ignored(self, keys: set[str], honoured: set[str], path: str, beside: str = "") -> None:
        for key in sorted(keys - honoured):
            if key in ("if", "then", "else"):
                key = "if/then/else"
            self.refuse(f"{key} beside {beside}" if beside else key, path)

    def _ref(self, node: dict, keys: set[str], path: str, depth: int) -> dict:
        ref = node["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#"):
            self.refuse(f"$ref to {str(ref)[:80]!r} (only local #/... references)", path)
            return {}
        self._ignored(keys, {"$ref"}, path, "$ref")
        if ref.rstrip("/") in self.active_refs:
            self.refuse(f"the recursive $ref {ref!r}", path)
            return {}
        try:
            target = _pointer(self.root, ref)
        except KeyError:
            raise UnsupportedSchema(f"$ref {ref!r} at {path or '/'} names nothing in the schema"
                                    ) from None  # fmt: skip
        self.active_refs.append(ref.rstrip("/"))
        try:
            return self.schema(target, ref[1:], depth + 1)
        finally:
            self.active_refs.pop()

    def _union(self, node, kind, keys, path, depth) -> dict | None:
        present = [k for k in ("anyOf", "oneOf") if k in keys]
        if not present:
            return None
        if len(present) == 2:
            self.refuse("oneOf beside anyOf", path)
        key = present[0]
        branches = node[key]
        if not isinstance(branches, list) or not branches:
            raise UnsupportedSchema(f"{key} at {path or '/'} must be a non-empty list of schemas")
        self._ignored(keys, set(present), path, key)
        return {key: [self.schema(b, f"{path}/{key}/{i}", depth + 1)
                      for i, b in enumerate(branches)]}  # fmt: skip

    def _constant(self, node, kind, keys, path, depth) -> dict | None:
        if "const" in keys:
            values, key = [node["const"]], "const"
        elif "enum" in keys:
            values, key = node["enum"], "enum"
            if not isinstance(values, list) or not 1 <= len(values) <= MAX_ENUM_VALUES:
                raise UnsupportedSchema(
                    f"enum at {path or '/'} must list 1 to {MAX_ENUM_VALUES} values"
                )
        else:
            return None
        self._ignored(keys, {key, "type"}, path, key)
        if not _plain_text(values):
            self.refuse(f"{key} strings with quotes, backslashes or control characters", path)
        if kind is not None and not all(_is_type(v, kind) for v in values):
            self.refuse(f"{key} values that are not of type {kind}", path)
        return {"const": values[0]} if key == "const" else {"enum": list(values)}

    def _object(self, node, kind, keys, path, depth) -> dict | None:
        extra = node.get("additionalProperties")
        if kind not in (None, "object") or not (
            "properties" in keys or ("additionalProperties" in keys and extra is not True)
        ):
            return None
        self._ignored(keys, {"type", "properties", "required", "additionalProperties"}, path)
        properties = node.get("properties", {})
        if not isinstance(properties, dict):
            raise UnsupportedSchema(f"properties at {path or '/'} must be an object")
        required = node.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise UnsupportedSchema(f"required at {path or '/'} must be a list of names")
        missing = [name for name in required if name not in properties]
        if missing:
            self.refuse(f"required names not in properties ({', '.join(missing[:5])})", path)
        if not _plain_text(list(properties)):
            self.refuse("property names with quotes, backslashes or control characters", path)
        out: dict = {
            "type": "object",
            "properties": {name: self.schema(sub, f"{path}/properties/{name}", depth + 1)
                           for name, sub in properties.items()},
            "required": list(dict.fromkeys(required)),
        }  # fmt: skip
        if extra is True or isinstance(extra, dict):
            out["additionalProperties"] = (
                {} if extra is True else self.schema(extra, f"{path}/additionalProperties",
                                                     depth + 1)
            )  # fmt: skip
            if out["additionalProperties"] == {}:
                out["additionalProperties"] = True
        elif extra not in (None, False):
            raise UnsupportedSchema(f"additionalProperties at {path or '/'} must be a boolean "
                                    "or a schema")  # fmt: skip
        return out

    def _all_of(self, node, kind, keys, path, depth) -> dict | None:
        if "allOf" not in keys:
            return None
        parts = node["allOf"]
        if not isinstance(parts, list) or not parts:
            raise UnsupportedSchema(f"allOf at {path or '/'} must be a non-empty list of schemas")
        if len(parts) == 1 and keys <= {"allOf", "type"}:  # a lone part is that part
            part = self.schema(parts[0], f"{path}/allOf/0", depth + 1)
            if kind is not None and part.get("type", kind) != kind:
                self.refuse("allOf whose part has another type", path)
            return part
        if kind not in (None, "object"):
            self.refuse("allOf of anything but objects", path)
            return {}
        self._ignored(keys, {"allOf", "type"}, path, "allOf")
        merged = []
        for i, part in enumerate(parts):
            where = f"{path}/allOf/{i}"
            part = self.schema(part, where, depth + 1)
            if part.get("type") != "object" or not set(part) <= {"type", "properties",
                                                                 "required"}:  # fmt: skip
                self.refuse("allOf parts other than objects with properties and required", where)
                continue
            merged.append(part)
        return {"type": "object", "allOf": merged}

    def _array(self, node, kind, keys, path, depth) -> dict | None:
        if kind not in (None, "array") or not ({"items", "prefixItems"} & keys):
            return None
        items = node.get("items")
        tuple_items = node.get("prefixItems", items if isinstance(items, list) else None)
        if tuple_items is not None:
            if not isinstance(tuple_items, list):
                raise UnsupportedSchema(f"prefixItems at {path or '/'} must be a list of schemas")
            honoured = {"type", "prefixItems", "items"}
            if "prefixItems" in node and items not in (None, False):
                self.refuse("items beside prefixItems", path)
            if isinstance(items, list) and node.get("additionalItems", False) is not False:
                self.refuse("additionalItems", path)
            honoured.add("additionalItems")
            self._ignored(keys, honoured, path, "prefixItems")
            return {"type": "array", "prefixItems": [
                self.schema(sub, f"{path}/prefixItems/{i}", depth + 1)
                for i, sub in enumerate(tuple_items)
            ]}  # fmt: skip
        self._ignored(keys - ({"uniqueItems"} if node.get("uniqueItems") is False else set()),
                      {"type", "items", "minItems", "maxItems"}, path)  # fmt: skip
        low = _count("minItems", node.get("minItems", 0), path, MAX_ARRAY_ITEMS)
        high = _count("maxItems", node.get("maxItems", MAX_ARRAY_ITEMS), path, MAX_ARRAY_ITEMS)
        if low > high:
            raise UnsupportedSchema(f"minItems is above maxItems at {path or '/'}")
        out = {"type": "array", "items": self.schema(items, f"{path}/items", depth + 1),
               "minItems": low}  # fmt: skip
        if "maxItems" in node:
            out["maxItems"] = high
        return out

    def _string(self, node, kind, keys, path, depth) -> dict | None:
        lengths = {"minLength", "maxLength"} & keys
        if kind not in (None, "string") or not ({"pattern", "format"} | lengths) & keys:
            return None
        if "pattern" in keys:
            self._ignored(keys, {"type", "pattern"}, path, "pattern")
            problem = _pattern_problem(node["pattern"])
            if problem:
                self.refuse(f"pattern that {problem}", path)
            return {"type": "string", "pattern": node["pattern"]}
        if "format" in keys:
            fmt = node["format"]
            if not isinstance(fmt, str) or fmt not in FORMATS:
                self.refuse(f"format {str(fmt)[:40]!r} (only {', '.join(sorted(FORMATS))})", path)
            self._ignored(keys, {"type", "format"}, path, "format")
            return {"type": "string", "format": fmt}
        self._ignored(keys, {"type", "minLength", "maxLength"}, path)
        low = _count("minLength", node.get("minLength", 0), path, MAX_STRING_LENGTH)
        high = _count("maxLength", node.get("maxLength", MAX_STRING_LENGTH), path,
                      MAX_STRING_LENGTH)  # fmt: skip
        if low > high:
            raise UnsupportedSchema(f"minLength is above maxLength at {path or '/'}")
        out = {"type": "string", "minLength": low}
        if "maxLength" in node:
            out["maxLength"] = high
        return out

    def _primitive(self, node, kind, keys, path) -> dict:
        honoured = {"type"}
        if kind in (None, "object") and node.get("additionalProperties") is True:
            honoured.add("additionalProperties")
        if node.get("uniqueItems") is False:
            honoured.add("uniqueItems")
        self._ignored(keys, honoured, path)
        return {"type": kind or "object"}  # no constraint at all: any object is valid output


def _is_type(value: Any, kind: str) -> bool:
    if isinstance(value, bool) and kind in ("number", "integer"):
        return False
    if kind == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _PYTHON_TYPES[kind])


def normalise(schema: Any) -> dict:
    """The schema in the converter's subset; UnsupportedSchema naming what falls outside."""
    if not isinstance(schema, dict):
        raise UnsupportedSchema("a JSON schema must be a JSON object")
    size = len(json.dumps(schema))
    if size > MAX_SCHEMA_CHARS:
        raise UnsupportedSchema(f"the schema is {size} characters, over {MAX_SCHEMA_CHARS}")
    walker = _Normaliser(schema)
    out = walker.schema(schema, "")
    if walker.unsupported:
        listed = walker.unsupported[:MAX_LISTED]
        more = len(walker.unsupported) - len(listed)
        raise UnsupportedSchema(
            "this JSON schema uses what the grammar cannot enforce: " + "; ".join(listed)
            + (f"; and {more} more" if more else "")
        )  # fmt: skip
    return out


def _convert(schema: dict, rule: str = "") -> tuple[ModuleType, object]:
    module = _converter()
    converter = module.SchemaConverter(prop_order={}, allow_fetch=False, dotall=False,
                                       raw_pattern=False)  # fmt: skip
    try:
        converter.visit(schema, rule)
    except (AssertionError, ValueError, KeyError, TypeError, RecursionError) as exc:
        raise UnsupportedSchema(f"the schema cannot be turned into a grammar: {exc}") from None
    return module, converter


def _bounded(grammar: str) -> str:
    if len(grammar) > MAX_GRAMMAR_CHARS:
        raise UnsupportedSchema(
            f"the schema's grammar is {len(grammar)} characters, over {MAX_GRAMMAR_CHARS}: "
            "lower its maxLength, maxItems or number of properties"
        )
    return grammar


@functools.lru_cache(maxsize=64)
def _grammar_for(canonical: str) -> str:
    _, converter = _convert(normalise(json.loads(canonical)))
    return _bounded(converter.format_grammar())


def schema_grammar(schema: Any) -> str:
    """The GBNF grammar (root rule "root") whose every output parses as JSON and validates
    against `schema`; UnsupportedSchema (a ValueError) naming what it cannot enforce."""
    if not isinstance(schema, dict):
        raise UnsupportedSchema("a JSON schema must be a JSON object")
    return _grammar_for(json.dumps(schema, sort_keys=True))


def json_object_grammar() -> str:
    """JSON mode (Ollama `format: "json"`, OpenAI `json_object`): any JSON object."""
    return schema_grammar({"type": "object"})


def check_schema(schema: dict) -> dict:
    """A pydantic validator: the schema as sent, once it is known to convert."""
    schema_grammar(schema)
    return schema


def tool_call_grammar(
    calls: list[tuple[str, Any]], open_tag: str, close_tag: str, *, parallel: bool = True
) -> str:
    """A grammar for `open_tag {"name": ..., "arguments": {...}} close_tag` blocks (one, or
    one or more when `parallel`), each call's arguments held to its tool's parameter schema.
    A tool whose schema falls outside the subset gets any JSON object as arguments (its call
    is still recognised, as it was before any grammar)."""
    branches = []
    for name, parameters in calls:
        try:
            arguments = normalise(parameters if isinstance(parameters, dict) else {})
        except UnsupportedSchema:
            arguments = {"type": "object"}
        if arguments.get("type") not in (None, "object") or "anyOf" in arguments:
            arguments = {"type": "object"}
        branches.append({"type": "object", "properties": {"name": {"const": name},
                                                          "arguments": arguments},
                         "required": ["name", "arguments"]})  # fmt: skip
    module, converter = _convert({"anyOf": branches}, "call")
    tag = converter._format_literal  # the converter's own GBNF string literal
    block = f'{tag(open_tag)} "\\n"? call "\\n"? {tag(close_tag)}'
    converter._rules["root"] = f'{block} ("\\n" {block})*' if parallel else block
    return _bounded(converter.format_grammar())
