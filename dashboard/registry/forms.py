"""The registry's forms: a model's settings (bounded, each error naming its field), an upload,
and a LAN download."""

import json

from django import forms

from inference.downloads import validate_url
from inference.engine.params import InvalidParams, SamplingParams
from inference.gguf import ChatTemplateError
from inference.gguf.render_pool import render_chat_isolated
from inference.importing import ImportRefused, check_name
from inference.models import LLMModel
from inference.registry import parse_keep_alive

MAX_CONTEXT = 131072  # when the file does not state its context length
# What a chat template override must render: a plain alternating conversation (no system
# turn: some templates, Gemma's, refuse one).
SAMPLE_CONVERSATION = [
    {"role": "user", "content": "Hello!"},
    {"role": "assistant", "content": "Hi, how can I help?"},
    {"role": "user", "content": "What is the capital of France?"},
]


class ModelSettingsForm(forms.ModelForm):
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
    default_params = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 3}), label="Default sampling",
        help_text='sampling defaults as JSON, e.g. {"temperature": 0.7, "top_p": 0.9}',
    )  # fmt: skip

    class Meta:
        model = LLMModel
        fields = [
            "n_ctx", "n_gpu_layers", "n_threads", "n_batch", "n_ubatch", "kv_type", "flash_attn",
            "parallel", "keep_alive", "system_prompt", "default_params", "chat_template_override",
        ]  # fmt: skip
        labels = {
            "kv_type": "KV cache type", "flash_attn": "Flash attention",
            "keep_alive": "Keep-alive", "chat_template_override": "Chat template override",
        }  # fmt: skip
        widgets = {
            "system_prompt": forms.Textarea(attrs={"rows": 3}),
            "chat_template_override": forms.Textarea(attrs={"rows": 6, "spellcheck": "false"}),
        }

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        top = self.instance.context_length or MAX_CONTEXT
        self.fields["n_ctx"] = forms.IntegerField(
            min_value=min(256, top), max_value=top, label="Context per sequence (n_ctx)",
            help_text=f"context tokens per sequence (the model was trained for {top})",
        )  # fmt: skip
        if not self.is_bound:
            self.initial["default_params"] = json.dumps(self.instance.default_params or {})

    def clean_keep_alive(self) -> str:
        value = self.cleaned_data["keep_alive"].strip()
        try:
            parse_keep_alive(value)
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None
        return value

    def clean_default_params(self) -> dict:
        raw = (self.cleaned_data["default_params"] or "").strip()
        if not raw:
            return {}
        try:
            params = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(f"not valid JSON: {exc.msg} at line {exc.lineno}") from None
        if not isinstance(params, dict):
            raise forms.ValidationError('must be a JSON object, e.g. {"temperature": 0.7}')
        unknown = sorted(set(params) - set(SamplingParams.__dataclass_fields__))
        if unknown:
            raise forms.ValidationError(f"unknown sampling parameter: {', '.join(unknown)}")
        try:
            SamplingParams(**params)
        except InvalidParams as exc:
            raise forms.ValidationError(str(exc)) from None  # "temperature: must be between …"
        return params

    def clean_chat_template_override(self) -> str:
        template = self.cleaned_data["chat_template_override"]
        if not template.strip():
            return ""
        metadata = self.instance.metadata or {}
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
        n_batch, n_ubatch = data.get("n_batch"), data.get("n_ubatch")
        if n_batch is not None and n_ubatch is not None and n_ubatch > n_batch:
            self.add_error("n_ubatch", f"must be at most n_batch ({n_batch})")
        # llama.cpp only quantises the V cache with flash attention; it would fail at load.
        if data.get("kv_type", "f16") != "f16" and not data.get("flash_attn"):
            self.add_error("kv_type", "a quantised KV cache needs flash attention on")
        return data


class UploadForm(forms.Form):
    file = forms.FileField(help_text="a .gguf model file")
    name = forms.CharField(
        required=False, max_length=100, help_text="registry name (default: from the file name)"
    )

    def clean_name(self) -> str:
        return _free_name(self.cleaned_data["name"])


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


def _free_name(name: str) -> str:
    name = (name or "").strip()
    if not name:
        return ""
    try:
        return check_name(name)
    except ImportRefused as exc:
        raise forms.ValidationError(str(exc)) from None
