"""llama-server's GET /props: the model it serves, its context, its modalities and chat template,
its default generation settings and slots, in llama-server's shape (get_res_props in
tools/server/server-context.cpp), with what is true for this box.

llama-server serves one model; the appliance serves many, so /props describes the default one,
or the one `?model=` names. n_ctx is the context per sequence the loaded engine holds (an
automatic context is sized at load: until then, the model's setting, 0 for automatic, or its
training context); total_slots is the sequences it answers at once.
"""

from importlib.metadata import PackageNotFoundError, version

from asgiref.sync import sync_to_async
from django.http import HttpRequest, JsonResponse

from dashboard.api import pipeline
from dashboard.api.auth import api_endpoint
from dashboard.api.llama_server.sampling import settings_json
from inference.catalog.specs import sampling_for
from inference.models import LLMModel
from inference.serving.client import get_client


def build_info() -> str:
    """What llama-server's build_info says of its build: here, the appliance's and llama.cpp's."""
    found = []
    for package in ("homelab-appliance", "llama_cpp_python"):
        try:
            found.append(f"{package} {version(package)}")
        except PackageNotFoundError:
            found.append(f"{package} unknown")
    return ", ".join(found)


def loaded_context(model: LLMModel) -> int | None:
    """The context per sequence of the engine holding `model` now, where one does."""
    name = model.weights.name
    for snap in get_client().snapshots():
        for row in snap.get("loaded", []):
            if row["name"] == name:
                runner = (snap.get("models", {}).get(name) or {}).get("model") or {}
                return runner.get("ctx_per_seq") or row.get("ctx_per_seq")
    return None


def default_settings(model: LLMModel) -> dict:
    """A request's sampling when it asks nothing: the model's saved defaults over the engine's,
    by llama-server's names."""
    return settings_json(sampling_for(model, {}))


def props(model: LLMModel) -> dict:
    """The /props object for `model` (database and engine reads: off the event loop)."""
    weights = model.weights
    n_ctx = loaded_context(model) or weights.n_ctx or model.context_length or 0
    metadata = model.metadata or {}
    return {
        "default_generation_settings": {"params": default_settings(model), "n_ctx": n_ctx},
        "total_slots": weights.parallel,
        "model_alias": model.name,
        "model_path": weights.file_path,
        "modalities": {"vision": model.takes_images, "video": False, "audio": False},
        "chat_template": model.effective_chat_template,
        "bos_token": metadata.get("bos_token") or "",
        "eos_token": metadata.get("eos_token") or "",
        "build_info": build_info(),
        "endpoint_slots": False,
        "endpoint_props": False,
        "endpoint_metrics": True,
        "is_sleeping": False,
    }


@api_endpoint(dialect="openai")
async def get_props(request: HttpRequest) -> JsonResponse:
    model = await pipeline.resolve_model(request.GET.get("model") or None)
    return JsonResponse(await sync_to_async(props)(model))
