"""The catalog and the loaded models in Ollama's shapes: /api/tags, /api/ps, /api/show (with a
derived model's base as its parent and FROM)."""

import json
from datetime import UTC, datetime, timedelta

from dashboard.api.tools import template_renders_tools
from inference.catalog.creating import ollama_parameters
from inference.models import LLMModel
from inference.text.thinking import thinking_mode

# Ollama reports a model kept loaded for ever (keep_alive < 0) with an expiry centuries away.
FOREVER = timedelta(days=365 * 290)


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def now_iso() -> str:
    return iso(datetime.now(UTC))


def tag_names(model: LLMModel) -> list[str]:
    """The names it was pulled as ("llama3.2:1b"), so an app finds what it pulled; else the
    catalog name as Ollama's latest tag."""
    return [pulled.name for pulled in model.pulled_names.all()] or [f"{model.name}:latest"]


def tag_name(model: LLMModel) -> str:
    return tag_names(model)[0]


def human_count(count: int | None) -> str:
    """Ollama's parameter_size: 135M, 1.2B, 8B."""
    if not count:
        return ""
    for unit, size, decimals in (("B", 1e9, 1), ("M", 1e6, 2), ("K", 1e3, 0)):
        if count >= size:
            value = count / size
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.{decimals}f}{unit}"
    return str(count)


def capabilities(model: LLMModel) -> list[str]:
    """What the model can be asked, in Ollama's names: "vision" when it takes images (Open WebUI
    enables image upload from it), "insert" when its vocabulary has FIM tokens, "tools" and
    "thinking" where its template renders them. A reranker (rank pooling) has "rerank" alone:
    it answers only /v1/rerank."""
    if model.is_reranker:
        return ["rerank"]
    found = ["completion"]
    if model.fills_in_middle:
        found.append("insert")  # a suffix is accepted (Continue's autocomplete looks for it)
    if model.takes_images:
        found.append("vision")
    if template_renders_tools(model.effective_chat_template):
        found.append("tools")
    if thinking_mode(model.effective_chat_template):
        found.append("thinking")  # Ollama's name: think: true is accepted
    return found


def details(model: LLMModel) -> dict:
    families = [model.architecture] if model.architecture else []
    if model.takes_images:
        families.append("clip")  # as Ollama lists a model with a vision projector
    return {
        # A derived model's base, by the name /api/tags lists it under.
        "parent_model": tag_name(model.base) if model.base_id else "",
        "format": "gguf",
        "family": model.architecture,
        "families": families or None,
        "parameter_size": human_count(model.parameter_count),
        "quantization_level": model.quantization,
    }


def tag(model: LLMModel, name: str | None = None) -> dict:
    name = name or tag_name(model)
    return {
        "name": name,
        "model": name,
        "modified_at": iso(model.last_used_at or model.created_at),
        "size": model.size_bytes,
        "digest": model.sha256,
        "details": details(model),
        # Not in Ollama's tags; llama-server's have it, and a client can tell a vision model
        # from the list without asking /api/show of each.
        "capabilities": capabilities(model),
    }


def _vram_bytes(size: int, model: LLMModel, runner: dict) -> int:
    """The share of the weights on the GPU: what llama.cpp says it put there (the runner's
    `gpu_buffers`, which also holds when the preflight fitted fewer layers to the card than
    the setting asks), else reckoned from the layers setting (a runner that does not say)."""
    if not runner.get("gpu_offload") or model.n_gpu_layers == 0:
        return 0
    split = runner.get("gpu_buffers")
    if isinstance(split, dict):
        return min(size, int(split.get("weights") or 0))
    if model.n_gpu_layers < 0 or not model.layer_count:
        return size
    return int(size * min(1.0, model.n_gpu_layers / (model.layer_count + 1)))


def process(row: dict, model: LLMModel | None, runner: dict, now: datetime) -> dict:
    """One loaded model (a row of EngineHost.loaded() and its runner info) as `ollama ps`."""
    expires_in = row.get("expires_in")
    expires = now + (FOREVER if expires_in is None else timedelta(seconds=max(0.0, expires_in)))
    size = int(row.get("size_bytes") or 0)
    name = tag_name(model) if model else f"{row['name']}:latest"
    return {
        "name": name,
        "model": name,
        "size": size,
        "digest": model.sha256 if model else "",
        "details": details(model) if model else {"format": "gguf"},
        "expires_at": iso(expires),
        "size_vram": _vram_bytes(size, model, runner) if model else 0,
        # What the loaded engine holds per sequence (automatic or asked contexts resolved).
        "context_length": runner.get("ctx_per_seq") or row.get("ctx_per_seq")
        or (model.n_ctx if model else None) or None,
    }


def _parameters(model: LLMModel) -> str:
    # An explicit context per sequence, as a Modelfile's PARAMETER num_ctx; an automatic one
    # (n_ctx 0) is sized at load, and /api/ps reports what was loaded.
    n_ctx = model.weights.n_ctx
    lines = [f"{'num_ctx':<15} {n_ctx}"] if n_ctx else []
    for key, value in sorted(ollama_parameters(model).items()):
        for item in value if isinstance(value, list) else [value]:
            lines.append(f"{key:<15} {item}")
    return "\n".join(lines)


def template(model: LLMModel) -> str:
    """The chat template; for a model that fills in the middle, inside the branch Ollama's code
    models show for a suffix (Continue sends `suffix` only where the template holds `.Suffix`),
    written with the model's FIM tokens. The appliance reads neither branch: a suffix is laid
    out as llama-server's /infill (dashboard.api.fim)."""
    chat = model.effective_chat_template
    if not model.fills_in_middle:
        return chat
    pre, suf, mid = (model.fim_tokens[role]["text"] for role in ("pre", "suf", "mid"))
    return ("{{- if .Suffix }}" + pre + "{{ .Prompt }}" + suf + "{{ .Suffix }}" + mid
            + "{{- else }}" + chat + "{{- end }}")  # fmt: skip


def show(model: LLMModel) -> dict:
    arch = model.architecture or "general"
    info = {
        "general.architecture": model.architecture,
        "general.parameter_count": model.parameter_count,
        "general.file_type": model.quantization,
        f"{arch}.context_length": model.context_length,
        f"{arch}.block_count": model.layer_count,
        f"{arch}.embedding_length": model.embedding_length,
        f"{arch}.attention.head_count": model.head_count,
        f"{arch}.attention.head_count_kv": model.head_count_kv,
    }
    modelfile = [f"FROM {tag_name(model.base) if model.base_id else model.name}"]
    if model.chat_template_override:
        modelfile.append(f'TEMPLATE """{model.chat_template_override}"""')
    modelfile += [f"PARAMETER {line}" for line in _parameters(model).splitlines()]
    if model.system_prompt:
        modelfile.append(f'SYSTEM """{model.system_prompt}"""')
    for message in model.seed_messages or []:
        modelfile.append(f"MESSAGE {message['role']} {json.dumps(message['content'])}")
    if model.license:
        modelfile.append(f'LICENSE """{model.license}"""')
    return {
        "license": model.license,
        "modelfile": "\n".join(modelfile) + "\n",
        "parameters": _parameters(model),
        "template": template(model),
        "system": model.system_prompt,
        "messages": list(model.seed_messages or []),
        "details": details(model),
        "model_info": {k: v for k, v in info.items() if v not in (None, "")},
        "capabilities": capabilities(model),
        "modified_at": iso(model.last_used_at or model.created_at),
        **({"projector_info": projector_info(model)} if model.takes_images else {}),
    }


def projector_info(model: LLMModel) -> dict:
    """The vision projector's header keys (clip.*), as Ollama's show gives a model's
    projector_info."""
    projector = model.weights.projector
    keys = (projector.metadata or {}).get("keys") or {}
    info = {"general.architecture": "clip", "clip.projector_type": projector.projector_type}
    return {**info, **{k: v for k, v in keys.items() if k.startswith("clip.")}}
