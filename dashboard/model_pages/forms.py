"""The registry's forms: a model's settings (bounded, each error naming its field), an upload,
and a LAN download."""

from django import forms

from inference.catalog.drafts import draft_problem
from inference.catalog.fetching import validate_url
from inference.catalog.importing import ImportRefused, check_name
from inference.catalog.projectors import projector_problem
from inference.catalog.pulling.names import MAX_NAME_CHARS, InvalidName
from inference.catalog.pulling.names import parse as parse_pull_name
from inference.catalog.specs import parse_keep_alive
from inference.engine.params import (
    _FLOAT_BOUNDS,  # the engine's own bound tables: the form refuses what the API refuses
    _INT_BOUNDS,
    MAX_STOP_LENGTH,
    MAX_STOP_STRINGS,
    InvalidParams,
    SamplingParams,
    usable_defaults,
)
from inference.gguf import ChatTemplateError
from inference.gguf.render_pool import render_chat_isolated
from inference.models import LLMModel, Projector

MAX_CONTEXT = 131072  # when the file does not state its context length
# What a chat template override must render: a plain alternating conversation (no system
# turn: some templates, Gemma's, refuse one).
SAMPLE_CONVERSATION = [
    {"role": "user", "content": "Hello!"},
    {"role": "assistant", "content": "Hi, how can I help?"},
    {"role": "user", "content": "What is the capital of France?"},
]


class OwnSettingsForm(forms.ModelForm):
    """What a model has of its own and applies at its next answer: system prompt, chat template
    override, default sampling. All a derived model has: its load settings are its base's."""

    class Meta:
        model = LLMModel
        fields = ["system_prompt", "chat_template_override"]
        labels = {"chat_template_override": "Chat template override"}
        widgets = {
            "system_prompt": forms.Textarea(attrs={"rows": 3}),
            "chat_template_override": forms.Textarea(attrs={"rows": 6, "spellcheck": "false"}),
        }

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        add_sampling_fields(self)

    def clean_chat_template_override(self) -> str:
        template = self.cleaned_data["chat_template_override"]
        if not template.strip():
            return ""
        metadata = self.instance.weights.metadata or {}
        try:
            # In a limited render process, like every render: the form is how a template
            # first reaches the appliance.
            rendered = render_chat_isolated(
                template, SAMPLE_CONVERSATION, bos_token=metadata.get("bos_token", ""),
                eos_token=metadata.get("eos_token", ""), add_generation_prompt=True,
            )  # fmt: skip
        except ChatTemplateError as exc:
            raise forms.ValidationError(
                f"the template cannot render a conversation: {exc}"
            ) from None
        if "France" not in rendered:
            raise forms.ValidationError("the template leaves the messages out of the prompt")
        return template

    def clean(self) -> dict:
        data = super().clean()
        self.sampling = clean_sampling(self, data)
        return data

    def save(self, commit: bool = True) -> LLMModel:
        self.instance.default_params = self.sampling
        return super().save(commit)

    @property
    def load_fields_changed(self) -> list[str]:
        """The changed settings that take effect only when the model loads again."""
        return [name for name in self.changed_data if name in LOAD_FIELDS]

    def sampling_fields(self) -> list:
        return [self[name] for name in self.fields if name.startswith(SAMPLING_PREFIX)]

    def other_fields(self) -> list:
        return [self[name] for name in self.fields if not name.startswith(SAMPLING_PREFIX)]


class ModelSettingsForm(OwnSettingsForm):
    """A model with weights of its own: its load settings too."""

    # Bounds beyond what the engine would accept: the sizes llama.cpp is tested with.
    n_gpu_layers = forms.IntegerField(
        min_value=-1, max_value=1000, label="GPU layers (n_gpu_layers)",
        help_text="-1: every layer the GPU takes; 0: CPU only",
    )  # fmt: skip
    n_threads = forms.IntegerField(min_value=0, max_value=256, label="Threads (n_threads)",
                                   help_text="0: all cores")  # fmt: skip
    n_batch = forms.IntegerField(min_value=32, max_value=8192, label="Batch (n_batch)",
                                 help_text="tokens per llama_decode call")  # fmt: skip
    n_ubatch = forms.IntegerField(min_value=32, max_value=8192, label="Micro-batch (n_ubatch)",
                                  help_text="at most n_batch")  # fmt: skip
    parallel = forms.IntegerField(
        min_value=1, max_value=16, label="Parallel sequences",
        help_text="sequences decoded together, each with a context of n_ctx tokens",
    )  # fmt: skip
    speculative = forms.ChoiceField(
        choices=LLMModel._meta.get_field("speculative").choices, label="Speculative decoding",
        help_text="auto: on predictable text (an edit, a list copied from the prompt) it checks "
        "several guessed tokens a step, where that is measured to be faster; answers stay the "
        "same. off: never for this model (SPECULATIVE_DECODING=off: never on this box)",
    )  # fmt: skip

    draft = forms.ModelChoiceField(
        queryset=LLMModel.objects.filter(base__isnull=True), required=False,
        label="Draft model", empty_label="none (drafts from the text itself)",
        help_text="a smaller model with the same vocabulary whose guesses are checked a step at "
        "a time; pays most on a GPU, and only where it is measured to",
    )  # fmt: skip

    projector = forms.ModelChoiceField(
        queryset=Projector.objects.all(), required=False, label="Projector",
        empty_label="none (text only)",
        help_text="a vision projector (mmproj) GGUF made for this model: with one it takes "
        "images. The files registered are listed; “Upload a projector” below adds one",
    )  # fmt: skip

    class Meta(OwnSettingsForm.Meta):
        fields = [
            "n_ctx", "n_gpu_layers", "n_threads", "n_batch", "n_ubatch", "kv_type", "flash_attn",
            "parallel", "speculative", "draft", "projector", "keep_alive",
            *OwnSettingsForm.Meta.fields,
        ]  # fmt: skip
        labels = {
            **OwnSettingsForm.Meta.labels, "kv_type": "KV cache type",
            "flash_attn": "Flash attention", "keep_alive": "Keep-alive",
        }  # fmt: skip

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        top = self.instance.context_length or MAX_CONTEXT
        self.fields["n_ctx"] = forms.IntegerField(
            min_value=0, max_value=top, label="Context per sequence (n_ctx)",
            help_text=f"context tokens per sequence (the model was trained for {top}); 0: "
            "automatic, the training context or what fits in memory",
        )  # fmt: skip

    def clean_n_ctx(self) -> int:
        value = self.cleaned_data["n_ctx"]
        floor = min(256, self.instance.context_length or MAX_CONTEXT)
        if 0 < value < floor:
            raise forms.ValidationError(f"must be 0 (automatic) or at least {floor}")
        return value

    def clean_draft(self) -> LLMModel | None:
        draft = self.cleaned_data["draft"]
        if draft is not None:
            problem = draft_problem(self.instance, draft)
            if problem:
                raise forms.ValidationError(f"{draft.name} cannot draft for this model: {problem}")
        return draft

    def clean_projector(self) -> Projector | None:
        projector = self.cleaned_data["projector"]
        return check_projector_for(self.instance, projector)

    def clean_keep_alive(self) -> str:
        value = self.cleaned_data["keep_alive"].strip()
        try:
            parse_keep_alive(value)
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None
        return value

    def clean(self) -> dict:
        data = super().clean()
        n_batch, n_ubatch = data.get("n_batch"), data.get("n_ubatch")
        if n_batch is not None and n_ubatch is not None and n_ubatch > n_batch:
            self.add_error("n_ubatch", f"must be at most n_batch ({n_batch})")
        # llama.cpp only quantises the V cache with flash attention; it would fail at load.
        if data.get("kv_type", "f16") != "f16" and not data.get("flash_attn"):
            self.add_error("kv_type", "a quantised KV cache needs flash attention on")
        return data


def check_projector_for(model: LLMModel, projector: Projector | None) -> Projector | None:
    """`projector` for `model`'s page, or a ValidationError saying why not: it must fit the
    model (inference.catalog.projectors), and the file may have one entry per projector."""
    if projector is not None:
        problem = projector_problem(model, projector)
        if problem:
            raise forms.ValidationError(f"{projector.file_name} cannot serve this model: "
                                        f"{problem}")  # fmt: skip
    same_pair = LLMModel.all_objects.filter(file_path=model.file_path, projector=projector,
                                            base__isnull=True)  # fmt: skip
    holder = same_pair.exclude(pk=model.pk).first()
    if holder is not None:
        pairing = "with this projector" if projector else "without a projector"
        raise forms.ValidationError(f"{holder.name} is this file {pairing} already")
    return projector


# The settings read when the model loads (llama.cpp's context, and the runner's speculation):
# changing one means a reload.
LOAD_FIELDS = frozenset({
    "n_ctx", "n_gpu_layers", "n_threads", "n_batch", "n_ubatch", "kv_type", "flash_attn",
    "parallel", "speculative", "draft", "projector",
})  # fmt: skip

# Default sampling, one small field per parameter, each empty for "the engine's default" (shown
# as the placeholder). Bounds come from inference.engine.params. Parameters set over the API or
# by hand that have no field here (seed, penalties) are kept as they are.
SAMPLING_PREFIX = "sampling_"
SAMPLING_FIELDS = {
    "temperature": ("Temperature", "0: always the likeliest word; higher: more varied"),
    "top_p": ("Top-p", "keep the likeliest words that add up to this share; 1: off"),
    "top_k": ("Top-k", "choose among this many likeliest words; 0: off"),
    "min_p": ("Min-p", "drop words less likely than this share of the likeliest; 0: off"),
    "repeat_penalty": ("Repeat penalty", "above 1 discourages repeating words; 1: off"),
    "max_tokens": ("Answer length (max_tokens)", "the most tokens one answer may have"),
}
ENGINE_DEFAULTS = SamplingParams()


def add_sampling_fields(form: forms.ModelForm) -> None:
    saved = form.instance.default_params if isinstance(form.instance.default_params, dict) else {}
    # What an empty field means: a derived model's base's default (inference.catalog), else
    # the engine's.
    base = form.instance.base if form.instance.base_id else None
    inherited = usable_defaults(base.default_params) if base is not None else {}
    for name, (label, help_text) in SAMPLING_FIELDS.items():
        if name in _FLOAT_BOUNDS:
            low, high = _FLOAT_BOUNDS[name]
            field = forms.FloatField(
                min_value=low, max_value=high, required=False, label=label,
                widget=forms.NumberInput(attrs={"step": "0.01", "inputmode": "decimal"}),
            )  # fmt: skip
        else:
            low, high = _INT_BOUNDS[name]
            field = forms.IntegerField(min_value=low, max_value=high, required=False, label=label)
        fallback = inherited.get(name, getattr(ENGINE_DEFAULTS, name))
        whose = f" from {base.name}" if name in inherited else ""
        field.help_text = f"{help_text} ({low} to {high}; empty: {fallback}{whose})"
        field.widget.attrs["placeholder"] = str(fallback)
        form.fields[SAMPLING_PREFIX + name] = field
        if not form.is_bound and name in saved:
            form.initial[SAMPLING_PREFIX + name] = saved[name]
    form.fields[SAMPLING_PREFIX + "stop"] = forms.CharField(
        required=False, label="Stop strings", strip=False,
        widget=forms.Textarea(attrs={"rows": 2, "spellcheck": "false"}),
        help_text=f"one per line: the answer ends before any of them (at most {MAX_STOP_STRINGS},"
        f" each up to {MAX_STOP_LENGTH} characters)",
    )  # fmt: skip
    if not form.is_bound:
        stop = saved.get("stop") or []
        stop = [stop] if isinstance(stop, str) else stop
        form.initial[SAMPLING_PREFIX + "stop"] = "\n".join(stop)


def clean_sampling(form: forms.ModelForm, data: dict) -> dict:
    """The model's default_params from the fields: the ones filled in, over what was saved
    (parameters without a field stay), checked whole by SamplingParams itself."""
    saved = form.instance.default_params if isinstance(form.instance.default_params, dict) else {}
    params = {key: value for key, value in saved.items()
              if key not in SAMPLING_FIELDS and key != "stop"}  # fmt: skip
    for name in SAMPLING_FIELDS:
        value = data.get(SAMPLING_PREFIX + name)
        if value is not None:
            params[name] = value
    lines = (data.get(SAMPLING_PREFIX + "stop") or "").replace("\r\n", "\n").split("\n")
    stop = [line for line in lines if line.strip()]
    if stop:
        params["stop"] = stop
    try:
        SamplingParams(**params)
    except InvalidParams as exc:  # "temperature: must be between …", named to its field
        field = SAMPLING_PREFIX + exc.field
        form.add_error(field if field in form.fields else None, str(exc).split(": ", 1)[-1])
    except TypeError as exc:  # a saved key SamplingParams does not know
        form.add_error(None, f"the saved sampling defaults hold an unknown parameter: {exc}")
    return params


class UploadForm(forms.Form):
    file = forms.FileField(help_text="a .gguf model file")
    name = forms.CharField(
        required=False, max_length=100, help_text="the model's name (default: from the file name)"
    )

    def clean_name(self) -> str:
        return _free_name(self.cleaned_data["name"])


class ProjectorUploadForm(forms.Form):
    file = forms.FileField(help_text="a vision projector (mmproj) .gguf made for this model")


class DownloadForm(forms.Form):
    url = forms.CharField(
        max_length=2000,
        label="URL",
        widget=forms.URLInput(attrs={"placeholder": "http://nas.local/model.gguf"}),
    )

    def clean_url(self) -> str:
        try:
            return validate_url(self.cleaned_data["url"])
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None


class PullForm(forms.Form):
    """A model name to pull, as /api/pull takes it (inference.catalog.pulling.names)."""

    name = forms.CharField(
        max_length=MAX_NAME_CHARS,
        label="Name",
        widget=forms.TextInput(attrs={"placeholder": "llama3.2:1b or hf.co/user/repo:Q4_K_M"}),
    )

    def clean_name(self) -> str:
        try:
            return parse_pull_name(self.cleaned_data["name"]).display
        except InvalidName as exc:
            raise forms.ValidationError(str(exc)) from None


def _free_name(name: str) -> str:
    name = (name or "").strip()
    if not name:
        return ""
    try:
        return check_name(name)
    except ImportRefused as exc:
        raise forms.ValidationError(str(exc)) from None


class DeriveForm(forms.Form):
    """A derived model (inference.catalog.creating): a name, the model whose weights it shares,
    and its own system prompt and a few sampling defaults; the same checks as /api/create's."""

    name = forms.CharField(max_length=100, label="Name")
    base = forms.ModelChoiceField(queryset=LLMModel.objects.filter(base__isnull=True),
                                  to_field_name="name", label="Base model")  # fmt: skip
    system = forms.CharField(required=False, max_length=32_000, label="System prompt",
                             widget=forms.Textarea(attrs={"rows": 3}))  # fmt: skip
    temperature = forms.FloatField(required=False, label="Temperature")
    top_p = forms.FloatField(required=False, label="Top p")
    top_k = forms.IntegerField(required=False, label="Top k")
    num_predict = forms.IntegerField(required=False, label="Answer length (tokens)")

    def parameters(self) -> dict:
        """The sampling fields filled in, in Ollama's names (creating.sampling_parameters)."""
        return {key: self.cleaned_data[key] for key in ("temperature", "top_p", "top_k",
                "num_predict") if self.cleaned_data.get(key) is not None}  # fmt: skip
