"""Making models from models: Ollama's /api/create (from a blob, or `from` another model) and
/api/copy, and removing what they made.

A *derived model* is a catalog entry with a `base`: no file of its own, the base's weights
loaded once under the base's name (inference.catalog.specs.spec_for), with its own system prompt,
sampling defaults (Ollama's `parameters`, each checked against the engine's bounds), chat
template (a Jinja template, rendered in the sandbox like every template) and seed messages.
Two derived models of one base share one engine; each request carries its model's defaults.

A copy is a name (PulledName), as a pulled model has: the same entry answers to both.
"""

import logging

from django.db import transaction

from inference.catalog.importing import check_name
from inference.catalog.pulling.names import InvalidName, parse
from inference.engine.params import InvalidParams, SamplingParams
from inference.gguf.chat_template import ChatTemplateError
from inference.gguf.render_pool import render_chat_isolated
from inference.models import LLMModel, PulledName

log = logging.getLogger(__name__)

# Ollama's parameter names → the engine's sampling fields (the same name unless listed).
OLLAMA_FIELDS = {
    "temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
    "repeat_penalty": "repeat_penalty", "repeat_last_n": "repeat_last_n",
    "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
    "seed": "seed", "num_predict": "max_tokens", "stop": "stop",
}  # fmt: skip
OUR_NAMES = {ours: theirs for theirs, ours in OLLAMA_FIELDS.items()}
# Ollama parameters that are settings of the weights' load, shared with the base, or that the
# engine does not have: accepted and left out, with a note in the progress lines.
IGNORED = frozenset({"num_ctx", "num_batch", "num_gpu", "main_gpu", "num_thread", "num_keep",
                     "use_mmap", "use_mlock", "numa", "low_vram", "mirostat", "mirostat_eta",
                     "mirostat_tau", "tfs_z", "typical_p", "penalize_newline"})  # fmt: skip
MAX_SYSTEM_CHARS = 32_000
MAX_TEMPLATE_CHARS = 64_000
MAX_SEED_MESSAGES = 64
SEED_ROLES = ("system", "user", "assistant")
# Fields a derived model copies from its base: what the base's file says, for listings.
HEADER_FIELDS = ("size_bytes", "sha256", "architecture", "parameter_count", "quantization",
                 "context_length", "layer_count", "embedding_length", "head_count",
                 "head_count_kv", "chat_template", "tokenizer", "license", "metadata")  # fmt: skip


class CreateRefused(ValueError):
    """A create, copy or delete that cannot be done; `param` names the request's field."""

    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.param = param
        self.status = status


def sampling_parameters(parameters: dict | None) -> tuple[dict, list[str]]:
    """(Ollama's `parameters` as the engine's sampling defaults, each bounds-checked, [the
    names left out]). A stop string alone becomes a list. Raises CreateRefused naming the
    parameter for a value out of bounds or an unknown name."""
    kept: dict = {}
    ignored: list[str] = []
    for name, value in (parameters or {}).items():
        if name in IGNORED:
            ignored.append(name)
            continue
        field = OLLAMA_FIELDS.get(name)
        if field is None:
            known = ", ".join(sorted(OLLAMA_FIELDS))
            raise CreateRefused(f"unknown parameter {name!r}; known: {known}", f"parameters.{name}")
        if field == "stop":
            value = [value] if isinstance(value, str) else value
            if not isinstance(value, list):
                raise CreateRefused("stop must be a string or a list of strings", "parameters.stop")
            value = [*kept.get("stop", []), *value]
        try:
            SamplingParams(**{field: tuple(value) if field == "stop" else value})
        except InvalidParams as exc:
            message = str(exc).split(": ", 1)[-1]
            raise CreateRefused(f"parameter {name}: {message}", f"parameters.{name}") from None
        except TypeError:
            raise CreateRefused(
                f"parameter {name} has the wrong type", f"parameters.{name}"
            ) from None
        kept[field] = value
    return kept, ignored


def ollama_parameters(model: LLMModel) -> dict:
    """A model's sampling defaults (its base's under its own) in Ollama's names."""
    saved = {**model.weights.default_params, **model.default_params} if model.base_id else dict(
        model.default_params or {})  # fmt: skip
    return {OUR_NAMES.get(key, key): value for key, value in saved.items()}


def seed_messages(messages: list | None) -> list[dict]:
    """Ollama's `messages`: role and content of each, checked."""
    if not messages:
        return []
    if not isinstance(messages, list) or len(messages) > MAX_SEED_MESSAGES:
        raise CreateRefused(f"messages must be a list of at most {MAX_SEED_MESSAGES}", "messages")
    kept = []
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        if role not in SEED_ROLES or not isinstance(content, str):
            raise CreateRefused(f"messages[{i}] needs a role ({', '.join(SEED_ROLES)}) and text "
                                "content", f"messages[{i}]")  # fmt: skip
        kept.append({"role": role, "content": content})
    return kept


def check_template(model: LLMModel, template: str) -> str:
    """A chat template someone sent: rendered once in the sandbox on a sample conversation, so
    a broken one is refused now rather than at every chat. Ollama's Go templates are not Jinja
    and are refused so."""
    if len(template) > MAX_TEMPLATE_CHARS:
        raise CreateRefused(f"template is at most {MAX_TEMPLATE_CHARS} characters", "template")
    sample = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    try:
        render_chat_isolated(template, sample, bos_token=model.metadata.get("bos_token", ""),
                             eos_token=model.metadata.get("eos_token", ""))  # fmt: skip
    except ChatTemplateError as exc:
        raise CreateRefused(
            "template must be a Jinja chat template (as a GGUF carries; Ollama's Go templates "
            f"are not supported): {exc}", "template",
        ) from None  # fmt: skip
    return template


def entry_name(name: str) -> tuple[str, str]:
    """(the catalog slug, the name as /api/tags lists it) for a name given to create or copy."""
    try:
        parsed = parse(name)
    except InvalidName as exc:
        raise CreateRefused(str(exc), "model") from None
    return parsed.slug, parsed.display


def name_taken(display: str) -> LLMModel | None:
    held = PulledName.objects.select_related("model").filter(name__iexact=display).first()
    return held.model if held else None


def _own_names(model: LLMModel) -> None:
    """Give a model without pulled names its catalog name as one ("name:latest"), so that a
    second name added beside it does not hide the first from /api/tags."""
    if not model.pulled_names.exists():
        PulledName.objects.get_or_create(name=f"{model.name}:latest", model=model)


def add_name(model: LLMModel, name: str) -> str:
    """Ollama's copy: `name` answers for `model` too. Idempotent; refused when the name
    already belongs to another model."""
    slug, display = entry_name(name)
    holder = name_taken(display)
    if holder is None:
        holder = LLMModel.objects.filter(name=slug).exclude(pk=model.pk).first()
    if holder is not None and holder.pk != model.pk:
        raise CreateRefused(f"{display} already names the model {holder.name}; delete it first",
                            "destination", status=409)  # fmt: skip
    with transaction.atomic():
        _own_names(model)
        PulledName.objects.get_or_create(name=display, model=model)
    log.info("%s now also answers as %s", model.name, display)
    return display


def apply_settings(
    model: LLMModel,
    *,
    system: str | None,
    template: str | None,
    parameters: dict,
    messages: list[dict],
    license: str | None,
) -> None:
    if system is not None:
        if len(system) > MAX_SYSTEM_CHARS:
            raise CreateRefused(f"system is at most {MAX_SYSTEM_CHARS} characters", "system")
        model.system_prompt = system
    if template:
        model.chat_template_override = check_template(model, template)
    if parameters:
        model.default_params = {**(model.default_params or {}), **parameters}
    if messages:
        model.seed_messages = messages
    if license:
        model.license = license[:200]


def derive(base: LLMModel, name: str, *, system: str | None = None, template: str | None = None,
           parameters: dict | None = None, messages: list[dict] | None = None,
           license: str | None = None) -> LLMModel:  # fmt: skip
    """A derived model of `base` (of its base, when `base` is derived itself: its settings are
    the starting point) named `name`; the fields not given are the base's."""
    slug, display = entry_name(name)
    if name_taken(display) is not None or LLMModel.all_objects.filter(name=slug).exists():
        raise CreateRefused(f"a model named {display} exists already; delete it first", "model",
                            status=409)  # fmt: skip
    try:
        check_name(slug)
    except ValueError as exc:
        raise CreateRefused(str(exc), "model") from None
    root = base.weights
    model = LLMModel(
        name=slug, base=root, file_path="", source=LLMModel.Source.DERIVED,
        **{field: getattr(root, field) for field in HEADER_FIELDS},
        system_prompt=base.system_prompt, chat_template_override=base.chat_template_override,
        default_params=dict(base.default_params) if base.base_id else {},
        seed_messages=list(base.seed_messages or []),
        n_ctx=root.n_ctx, parallel=root.parallel,
    )  # fmt: skip
    apply_settings(model, system=system, template=template, parameters=parameters or {},
                   messages=messages or [], license=license)  # fmt: skip
    with transaction.atomic():
        model.save()
        PulledName.objects.create(name=display, model=model)
    log.info("derived model %s made from %s", model.name, root.name)
    return model


def forget(model: LLMModel) -> str:
    """Delete a derived model: its entry and names only; the base's weights stay. The caller
    checks that `model` is derived."""
    was_default = model.is_default
    model.delete()
    if was_default:
        LLMModel.objects.filter(pk=model.base_id).update(is_default=True)
    return f"{model.name} deleted; {model.base.name}'s weights stay"


def derived_of(model: LLMModel) -> list[str]:
    return list(LLMModel.all_objects.filter(base=model).values_list("name", flat=True))
