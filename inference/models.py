"""The catalog of models, background jobs, and the stored figures of every request."""

from django.db import models
from django.db.models.functions import Lower

from inference.catalog.netguard import redact_url
from inference.engine.reranking import RANK_POOLING
from inference.gguf import fim_tokens

SERVING_RELATED = ("base", "draft", "base__draft", "projector", "base__projector")


class VisibleModels(models.Manager):
    """Registered models minus hidden ones (a deleted packaged model stays, hidden, so that
    bootstrap does not register it again)."""

    def get_queryset(self):
        return super().get_queryset().filter(hidden=False)

    def for_serving(self):
        """With what inference.catalog.specs.spec_for reads (the base, the draft model of the
        weights it loads): spec_for runs on the event loop too, where queries may not. Not the
        default: PostgreSQL refuses FOR UPDATE (update_or_create) across the outer joins."""
        return self.get_queryset().select_related(*SERVING_RELATED)


class Projector(models.Model):
    """A vision projector GGUF (general.architecture "clip", an "mmproj" file) that libmtmd
    loads beside a language model so that it takes images; checked against that model's width
    by inference.gguf.projector. Registered like a model's file (inference.catalog.projectors):
    its path, size and sha256, and what its header says; never listed as a model itself."""

    file_path = models.CharField(max_length=1000, unique=True)
    size_bytes = models.BigIntegerField(default=0)
    sha256 = models.CharField(max_length=64, blank=True)
    source = models.CharField(max_length=10, default="scan")  # one of LLMModel.Source
    projector_type = models.CharField(max_length=32)
    projection_dim = models.PositiveIntegerField()
    image_size = models.PositiveIntegerField()
    patch_size = models.PositiveIntegerField()
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["file_path"]

    def __str__(self) -> str:
        return self.file_name

    @property
    def file_name(self) -> str:
        return self.file_path.rsplit("/", 1)[-1]


class LLMModel(models.Model):
    """A GGUF file the appliance can load: what the file says, its hash, and its settings."""

    class Source(models.TextChoices):
        SCAN = "scan", "found in the models directory"
        UPLOAD = "upload", "uploaded"
        URL = "url", "downloaded"
        PACKAGE = "package", "from an installed package"
        IMPORT = "import", "imported with manage.py import_model"
        PULL = "pull", "pulled from a model registry"
        DERIVED = "derived", "made from another model (its weights, own settings)"

    class KvType(models.TextChoices):
        F16 = "f16"
        Q8_0 = "q8_0"
        Q4_0 = "q4_0"

    name = models.SlugField(max_length=100, unique=True)
    # Unique among models with weights of their own (see Meta); a derived model has none.
    file_path = models.CharField(max_length=1000, blank=True)
    size_bytes = models.BigIntegerField(default=0)
    sha256 = models.CharField(max_length=64, blank=True)
    source = models.CharField(max_length=10, choices=Source.choices, default=Source.SCAN)

    # What the GGUF header says (read with the validating reader).
    architecture = models.CharField(max_length=64, blank=True)
    parameter_count = models.BigIntegerField(null=True, blank=True)
    quantization = models.CharField(max_length=32, blank=True)
    context_length = models.IntegerField(null=True, blank=True)
    layer_count = models.IntegerField(null=True, blank=True)
    embedding_length = models.IntegerField(null=True, blank=True)
    head_count = models.IntegerField(null=True, blank=True)
    head_count_kv = models.IntegerField(null=True, blank=True)
    chat_template = models.TextField(blank=True)
    tokenizer = models.CharField(max_length=64, blank=True)
    license = models.CharField(max_length=200, blank=True)
    metadata = models.JSONField(default=dict, blank=True)

    # Settings (validated by the settings form; the engine receives them at load).
    n_ctx = models.PositiveIntegerField(
        default=0, help_text="context tokens per sequence; 0: automatic (sized at load)"
    )
    n_gpu_layers = models.IntegerField(default=-1, help_text="-1: all layers the GPU takes")
    n_threads = models.PositiveIntegerField(default=0, help_text="0: all cores")
    n_batch = models.PositiveIntegerField(default=512)
    n_ubatch = models.PositiveIntegerField(default=512)
    kv_type = models.CharField(max_length=8, choices=KvType.choices, default=KvType.F16)
    flash_attn = models.BooleanField(
        default=True, help_text="llama.cpp's auto flash attention; needed for a quantised KV cache"
    )
    # Eight: with warm memory a slot holds only a running answer (inference.catalog.specs
    # .kept_slots), and four held one app's eight clients to three answers at a time (the
    # reserve keeps one for a person), TTFT 3.5 s of which 3 s waiting for a slot (issue 32).
    parallel = models.PositiveIntegerField(default=8, help_text="sequences decoded together")
    speculative = models.CharField(
        max_length=8, choices=[("auto", "auto"), ("off", "off")], default="auto",
        help_text="speculative decoding: auto (as far as it pays, measured) or off",
    )  # fmt: skip
    # A smaller model with the same vocabulary whose guesses speculation verifies (Ollama's and
    # llama-server's draft model); checked by inference.catalog.drafts, loaded beside this one.
    draft = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="drafting_for",
        help_text="a small model of the same family that guesses this one's next tokens",
    )  # fmt: skip
    # A vision projector loaded beside the weights (libmtmd): with one, the model takes images.
    # Part of what loads, like the file: one language model file may have several entries,
    # each with its own projector (see Meta).
    projector = models.ForeignKey(
        Projector, null=True, blank=True, on_delete=models.PROTECT, related_name="models",
        help_text="a vision projector (mmproj) GGUF made for this model: it then takes images",
    )  # fmt: skip
    system_prompt = models.TextField(blank=True)
    default_params = models.JSONField(default=dict, blank=True)
    chat_template_override = models.TextField(blank=True)
    keep_alive = models.CharField(max_length=20, blank=True, help_text="e.g. 5m, 1h, 0, -1")
    # A derived model (Ollama's create `from`): its base's weights, loaded once under the base's
    # name, with this entry's own system prompt, defaults, template and seed messages.
    base = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="derived"
    )
    seed_messages = models.JSONField(
        default=list, blank=True, help_text="messages put before every conversation"
    )

    is_default = models.BooleanField(default=False)
    hidden = models.BooleanField(default=False, help_text="deleted packaged model: not listed")
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    # Load measurements: the estimate before, what the load actually took after.
    estimated_bytes = models.BigIntegerField(null=True, blank=True)
    measured_bytes = models.BigIntegerField(null=True, blank=True)
    last_load_seconds = models.FloatField(null=True, blank=True)
    # When a setting that takes effect at load (context, layers, batch, KV type...) last
    # changed: a model loaded before then runs with older settings until it is reloaded.
    load_settings_changed_at = models.DateTimeField(null=True, blank=True)

    objects = VisibleModels()  # the default: every list and lookup skips hidden models
    all_objects = models.Manager()

    class Meta:
        ordering = ["name"]
        base_manager_name = "all_objects"
        # One entry per file with weights of its own, and per file and projector: a language
        # model file serves as text-only once, and once with each projector.
        constraints = [
            models.UniqueConstraint(
                fields=["file_path"],
                condition=models.Q(base__isnull=True, projector__isnull=True),
                name="one_entry_per_weights_file",
            ),
            models.UniqueConstraint(
                fields=["file_path", "projector"],
                condition=models.Q(base__isnull=True, projector__isnull=False),
                name="one_entry_per_weights_and_projector",
            ),
        ]  # fmt: skip

    def __str__(self) -> str:
        return self.name

    @property
    def effective_chat_template(self) -> str:
        return self.chat_template_override or self.chat_template

    @property
    def takes_images(self) -> bool:
        """Whether its weights load with a vision projector (a derived model's: its base's)."""
        return self.weights.projector_id is not None

    @property
    def fim_tokens(self) -> dict[str, dict]:
        """Its vocabulary's fill-in-the-middle tokens by role ({"pre": {"id", "text"}, ...}), as
        the catalog read them (inference.gguf.fim_tokens); a derived model's: its base's."""
        found = (self.weights.metadata or {}).get("fim")
        return found if isinstance(found, dict) else {}

    @property
    def fills_in_middle(self) -> bool:
        """Whether it can fill in the middle (Ollama's capability "insert"): its vocabulary has
        the prefix, suffix and middle tokens."""
        return all(role in self.fim_tokens for role in fim_tokens.REQUIRED)

    @property
    def is_reranker(self) -> bool:
        """Whether its GGUF says pooling type rank (inference.engine.reranking): it scores
        documents against a query, and neither generates nor embeds."""
        keys = (self.weights.metadata or {}).get("keys") or {}
        arch = keys.get("general.architecture") or self.weights.architecture
        return keys.get(f"{arch}.pooling_type") == RANK_POOLING

    @property
    def weights(self) -> "LLMModel":
        """The entry whose file and load settings serve this one: its base, or itself."""
        return self.base if self.base_id else self


class PulledName(models.Model):
    """A name a model was pulled as ("llama3.2:1b", "hf.co/user/repo:Q4_K_M"), which the API
    lists and answers to, as Ollama does; pages and URLs use the model's slug `name`. Several
    names may hold one model (Ollama's llama3.2:latest and llama3.2:3b are the same file), and
    a name moves to the new model when its tag moved on (inference.catalog.pulling.pull)."""

    name = models.CharField(max_length=200)
    model = models.ForeignKey(LLMModel, on_delete=models.CASCADE, related_name="pulled_names")
    pulled_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        # Names compare without regard to case, as Ollama's do.
        constraints = [models.UniqueConstraint(Lower("name"), name="pulled_name_unique")]

    def __str__(self) -> str:
        return self.name


class Job(models.Model):
    """A background job (hashing, import, download), with progress for the dashboard."""

    class Kind(models.TextChoices):
        IMPORT = "import"
        HASH = "hash"
        DOWNLOAD = "download"
        UPLOAD = "upload"
        BENCHMARK = "benchmark"
        PULL = "pull"

    class State(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"
        CANCELLED = "cancelled"

    kind = models.CharField(max_length=12, choices=Kind.choices)
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING)
    progress = models.FloatField(default=0.0)  # 0..1
    message = models.TextField(blank=True)
    source = models.CharField(max_length=2000, blank=True)
    model = models.ForeignKey(LLMModel, null=True, blank=True, on_delete=models.SET_NULL)
    dismissed = models.BooleanField(default=False, help_text="an ended job hidden from the page")
    # Progress in numbers for whoever follows the job over the API (a pull's layers and
    # phase, inference.catalog.pulling.pull); the page reads `progress` and `message`.
    detail = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]

    @property
    def shown_source(self) -> str:
        """The source as pages show it: a download URL without its credentials (the job still
        downloads with them)."""
        return redact_url(self.source)


class RequestRecord(models.Model):
    """The figures of one finished request, kept for history (pruned after the retention)."""

    request_id = models.CharField(max_length=64, db_index=True)
    model_name = models.CharField(max_length=100)
    source = models.CharField(max_length=16)  # chat, openai, ollama
    client = models.CharField(max_length=100, blank=True)  # user name or API key name
    outcome = models.CharField(max_length=16)  # stop, length, cancelled, error
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    prompt_tokens = models.IntegerField(default=0)
    cached_tokens = models.IntegerField(default=0)
    output_tokens = models.IntegerField(default=0)
    queue_time = models.FloatField(null=True)
    load_time = models.FloatField(null=True)
    prefill_time = models.FloatField(null=True)
    prompt_tps = models.FloatField(null=True)
    ttft = models.FloatField(null=True)
    decode_tps = models.FloatField(null=True)
    itl_p50 = models.FloatField(null=True)
    itl_p95 = models.FloatField(null=True)
    itl_p99 = models.FloatField(null=True)
    itl_max = models.FloatField(null=True)
    total_time = models.FloatField(null=True)
    figures = models.JSONField(default=dict)
    # Split mode: the inference worker that answered, and why the router chose it
    # (inference.serving.routing's reasons); blank when embedded.
    worker = models.CharField(max_length=200, blank=True)
    route = models.CharField(max_length=32, blank=True)

    class Meta:
        ordering = ["-created_at"]

    @classmethod
    def from_figures(
        cls, *, request_id, model_name, source, client, outcome, figures, error="", route=None
    ):
        itl = figures.get("itl") or {}
        route = route or {}
        return cls(
            request_id=request_id, model_name=model_name, source=source, client=client,
            outcome=outcome, error=error, figures=figures,
            worker=str(route.get("worker") or "")[:200], route=str(route.get("reason") or "")[:32],
            prompt_tokens=figures.get("prompt_tokens") or 0,
            cached_tokens=figures.get("cached_tokens") or 0,
            output_tokens=figures.get("output_tokens") or 0,
            queue_time=figures.get("queue_time"), load_time=figures.get("load_time"),
            prefill_time=figures.get("prefill_time"), prompt_tps=figures.get("prompt_tps"),
            ttft=figures.get("ttft"), decode_tps=figures.get("decode_tps"),
            itl_p50=itl.get("p50"), itl_p95=itl.get("p95"), itl_p99=itl.get("p99"),
            itl_max=itl.get("max"), total_time=figures.get("total_time"),
        )  # fmt: skip
