"""Django admin for the catalog, jobs and request history: a view behind the pages, for
fixing records by hand. What the GGUF header says is read-only (the file is the truth)."""

import time

from django.contrib import admin

from inference.models import Job, LLMModel, Projector, RequestRecord

HEADER_FIELDS = (
    "file_path", "size_bytes", "sha256", "source", "architecture", "parameter_count",
    "quantization", "context_length", "layer_count", "embedding_length", "head_count",
    "head_count_kv", "chat_template", "tokenizer", "license", "metadata", "created_at",
    "last_used_at", "estimated_bytes", "measured_bytes", "last_load_seconds",
)  # fmt: skip


_loaded_cache: tuple[float, object, dict[str, dict]] = (0.0, None, {})


def loaded_names() -> dict[str, dict]:
    """Loaded models by name, from every inference worker's snapshot; read at most once a
    second, since the change list asks for every row."""
    global _loaded_cache
    from inference.serving.client import get_client

    client = get_client()
    read_at, read_from, rows = _loaded_cache
    if read_from is client and time.monotonic() - read_at < 1.0:
        return rows
    rows = {}
    for snap in client.snapshots():
        for row in snap.get("loaded") or []:
            rows[row["name"]] = row
    _loaded_cache = (time.monotonic(), client, rows)
    return rows


@admin.register(LLMModel)
class LLMModelAdmin(admin.ModelAdmin):
    list_display = ("name", "architecture", "quantization", "size_mib", "context_length",
                    "is_default", "loaded", "hidden", "source")  # fmt: skip
    list_filter = ("architecture", "quantization", "source", "is_default", "hidden")
    search_fields = ("name", "file_path", "sha256")
    readonly_fields = HEADER_FIELDS

    def get_queryset(self, request):
        return LLMModel.all_objects.all()  # hidden (deleted packaged) models too

    @admin.display(description="size")
    def size_mib(self, obj: LLMModel) -> str:
        return f"{obj.size_bytes / (1 << 20):.0f} MiB"

    @admin.display(boolean=True, description="loaded")
    def loaded(self, obj: LLMModel) -> bool:
        return obj.name in loaded_names()


@admin.register(Projector)
class ProjectorAdmin(admin.ModelAdmin):
    list_display = ("file_name", "projector_type", "projection_dim", "image_size", "source")
    search_fields = ("file_path", "sha256")
    # What the header says, checked against the models it serves: the file is the truth.
    readonly_fields = ("file_path", "size_bytes", "sha256", "source", "projector_type",
                       "projection_dim", "image_size", "patch_size", "metadata", "created_at")


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    # shown_source: a download URL's credentials stay out of the page.
    list_display = ("id", "kind", "state", "progress_percent", "shown_source", "model",
                    "updated_at")  # fmt: skip
    list_filter = ("kind", "state")
    readonly_fields = ("created_at", "updated_at")

    @admin.display(description="progress")
    def progress_percent(self, obj: Job) -> str:
        return f"{obj.progress * 100:.0f}%"


@admin.register(RequestRecord)
class RequestRecordAdmin(admin.ModelAdmin):
    list_display = ("created_at", "model_name", "source", "client", "outcome", "prompt_tokens",
                    "output_tokens", "ttft", "decode_tps")  # fmt: skip
    list_filter = ("source", "outcome", "model_name")
    search_fields = ("request_id", "client")
    date_hierarchy = "created_at"

    # History is measured, not edited.
    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
