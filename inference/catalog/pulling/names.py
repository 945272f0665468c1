"""Ollama model names: `model[:tag]`, `namespace/model[:tag]`, `host/namespace/model[:tag]`.

Missing parts are filled as Ollama fills them: namespace "library", tag "latest", and the
configured registry (MODEL_REGISTRY_URL) for the host. A name on `hf.co` or `huggingface.co`
means a Hugging Face repository, `hf.co/{user}/{repo}:{quant}`. Names compare without regard
to case, as Ollama's do.

A name is shown (and stored as the name a model was pulled as) in Ollama's shortest form with
the tag kept: Ollama's own registry and the "library" namespace are left out, anything else
stays, so "registry.ollama.ai/library/llama3.2" is "llama3.2:latest" and a LAN registry's
"nas:5000/home/tiny:v1" stays whole; `/api/tags` lists that form.

Unlike Ollama's parser, a host may carry a port: a registry on the LAN usually has one.
"""

import re
from dataclasses import dataclass

from django.utils.text import slugify

OLLAMA_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"
HUGGING_FACE_HOSTS = frozenset({"hf.co", "huggingface.co"})
MAX_NAME_CHARS = 200
MAX_PART_CHARS = 128

_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(:\d{1,5})?$")
_NAMESPACE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
_HF_USER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # Hugging Face user names may have dots
_MODEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")


class InvalidName(ValueError):
    """Not a model name; the message says which part is wrong."""


@dataclass(frozen=True, slots=True)
class PullName:
    host: str  # "" for the configured registry
    namespace: str
    model: str
    tag: str

    @property
    def is_hugging_face(self) -> bool:
        return self.host.lower() in HUGGING_FACE_HOSTS

    @property
    def display(self) -> str:
        """The shortest form with the tag, as /api/tags lists it."""
        if self.host and self.host.lower() != OLLAMA_HOST:
            return f"{self.host}/{self.namespace}/{self.model}:{self.tag}"
        if self.namespace.lower() != DEFAULT_NAMESPACE:
            return f"{self.namespace}/{self.model}:{self.tag}"
        return f"{self.model}:{self.tag}"

    @property
    def slug(self) -> str:
        """A registry name (pages and URLs) for it: "llama3.2:1b" becomes "llama3-2-1b"."""
        base = self.model if self.tag.lower() == DEFAULT_TAG else f"{self.model}-{self.tag}"
        return slugify(base.replace(".", "-"))[:90].strip("-_") or "model"


def parse(name: str) -> PullName:
    """The parts of `name`, defaults filled in; InvalidName says what is wrong."""
    if not isinstance(name, str) or not name.strip():
        raise InvalidName("a model name is required")
    text = name.strip()
    for scheme in ("http://", "https://"):  # as Ollama does; `insecure` says which to use
        if text.lower().startswith(scheme):
            text = text[len(scheme) :]
    if len(text) > MAX_NAME_CHARS:
        raise InvalidName(f"a model name is at most {MAX_NAME_CHARS} characters")
    if "@" in text:
        raise InvalidName("pulling by digest (name@sha256-…) is not supported; use a tag")
    path, tag = text, DEFAULT_TAG
    last = text.rsplit("/", 1)[-1]
    if ":" in last:
        path, tag = text.rsplit(":", 1)
    parts = path.split("/")
    if len(parts) == 1:
        host, namespace, model = "", DEFAULT_NAMESPACE, parts[0]
    elif len(parts) == 2:
        host, (namespace, model) = "", parts
    elif len(parts) == 3:
        host, namespace, model = parts
    else:
        raise InvalidName(f"{name!r} has too many parts: use [host/][namespace/]model[:tag]")
    _check("host", host, _HOST, optional=True)
    hugging_face = host.lower() in HUGGING_FACE_HOSTS
    _check("namespace", namespace, _HF_USER if hugging_face else _NAMESPACE)
    _check("model", model, _MODEL)
    _check("tag", tag, _TAG)
    if ".." in text:
        raise InvalidName(f"{name!r} has '..' in it")
    return PullName(host=host, namespace=namespace, model=model, tag=tag)


def _check(part: str, value: str, pattern: re.Pattern, *, optional: bool = False) -> None:
    if not value and optional:
        return
    if not value:
        raise InvalidName(f"the {part} part of the name is empty")
    if len(value) > MAX_PART_CHARS:
        raise InvalidName(f"the {part} part of the name is longer than {MAX_PART_CHARS}")
    if not pattern.match(value):
        raise InvalidName(f"the {part} {value!r} {_ALLOWED[part]}")


_ALLOWED = {
    "host": "must be a host name or address, with an optional :port",
    "namespace": "may only have letters, digits, '_' and '-'",
    "model": "may only have letters, digits, '_', '-' and '.', and start with a letter or digit",
    "tag": "may only have letters, digits, '_', '-' and '.'",
}


def canonical(name: str) -> str | None:
    """The stored form of `name` ("llama3.2" → "llama3.2:latest"), or None when it is no
    model name."""
    try:
        return parse(name).display
    except InvalidName:
        return None
