"""Where a pulled model's bytes come from: a plan for the pull job, made from the registry.

Ollama registry (the Docker registry protocol, as Ollama's server pulls):
1. GET {registry}/v2/{namespace}/{model}/manifests/{tag} with the Docker v2 manifest media type;
   the manifest lists layers by media type, digest and size.
2. The layer of type `application/vnd.ollama.image.model` is the GGUF, fetched by digest from
   {registry}/v2/{namespace}/{model}/blobs/{digest} (which usually redirects to a blob host);
   a `projector` layer (a vision model's mmproj, as llava's manifests have) is fetched with it.
3. The small layers are read too, each checked against its digest: `params` (JSON sampling
   defaults), `system` (a default system prompt) and `license`. The `template` layer is a Go
   template for Ollama's own renderer, not Jinja; the GGUF's own chat template is used instead,
   so it is not fetched. An adapter (LoRA) layer is refused: the model would answer
   differently without it.

Hugging Face (`hf.co/{user}/{repo}:{quant}`): the repository's files come from
{HF_ENDPOINT}/api/models/{user}/{repo}?blobs=true, the GGUF whose name has the quant in it
(Q4_K_M unless one is asked) is chosen, and fetched from /{user}/{repo}/resolve/main/{file},
verified against the sha256 that the listing gives for it. A repository with a vision projector
(an "mmproj" GGUF) has it fetched too, chosen as llama-server's -hf chooses it (choose_mmproj).

Every connection goes through the download guard (inference.catalog.netguard, via
inference.catalog.fetching.guarded_get), each redirect hop included; the configured registry and
Hugging Face endpoint are trusted wherever they are, since the appliance's settings name them.
"""

import hashlib
import json
import re
from dataclasses import dataclass, field, replace
from urllib.parse import quote, urlsplit

import httpx
from django.conf import settings

from inference.catalog import netguard
from inference.catalog.fetching import RETRIED, DownloadError, guarded_get
from inference.catalog.netguard import AddressRefused, DownloadPolicy, redact_text
from inference.catalog.pulling.names import DEFAULT_TAG, PullName

MANIFEST_ACCEPT = "application/vnd.docker.distribution.manifest.v2+json"
MEDIA = "application/vnd.ollama.image."
MODEL_MEDIA = MEDIA + "model"
PROJECTOR_MEDIA = MEDIA + "projector"
SMALL_LAYERS = ("params", "system", "license")  # read and used; the rest are not needed
REFUSED_LAYERS = {"adapter": "a LoRA adapter, which the appliance does not apply"}
MAX_MANIFEST_BYTES = 1 << 20
MAX_SMALL_LAYER_BYTES = 1 << 20
MAX_SMALL_LAYERS = 8  # a manifest could list thousands; Ollama's have one of each at most
MAX_LISTING_BYTES = 8 << 20  # a Hugging Face repository's file list
DEFAULT_QUANT = "Q4_K_M"
MMPROJ = "mmproj"  # in the name of a repository's vision projector GGUF
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_SPLIT_GGUF = re.compile(r"-\d{5}-of-\d{5}\.gguf$", re.IGNORECASE)


class PullError(Exception):
    """The pull cannot succeed; `status` is the HTTP status an API answer gets for it."""

    def __init__(self, message: str, status: int = 502):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Blob:
    """The GGUF file to fetch."""

    url: str
    digest: str  # "sha256:<hex>", or "" when the source states none
    size: int | None
    filename: str


@dataclass(frozen=True, slots=True)
class Plan:
    name: PullName
    blob: Blob
    source: str  # where it comes from, for messages
    layers: tuple[tuple[str, int], ...] = ()  # the small layers read (digest, size)
    params: dict = field(default_factory=dict)
    system: str = ""
    license: str = ""
    projector: Blob | None = None  # the vision projector fetched with the model


def pull_policy() -> DownloadPolicy:
    """The settings' download policy, with the configured registry and Hugging Face endpoint
    trusted: an admin named them, a request did not."""
    policy = netguard.settings_policy()
    trusted = set(policy.trusted)
    for url in (settings.MODEL_REGISTRY_URL, settings.HF_ENDPOINT):
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            trusted.update((address, port) for address in netguard.lookup(parts.hostname, port))
        except OSError:  # not resolvable now: then not reachable either
            continue
    return replace(policy, trusted=frozenset(trusted))


def registry_base(name: PullName, *, insecure: bool) -> str:
    """The registry URL a name is pulled from: the configured one unless the name has a host
    of its own (https, or http with `insecure` as Ollama's flag allows)."""
    configured = settings.MODEL_REGISTRY_URL
    if not name.host or name.host.lower() == urlsplit(configured).netloc.lower():
        return configured
    return f"{'http' if insecure else 'https'}://{name.host}"


def plan_pull(name: PullName, *, insecure: bool, policy: DownloadPolicy) -> Plan:
    if name.is_hugging_face:
        return _hugging_face_plan(name, policy)
    return _registry_plan(name, registry_base(name, insecure=insecure), policy)


# 1. Ollama registries.


def _registry_plan(name: PullName, base: str, policy: DownloadPolicy) -> Plan:
    repo = f"{base}/v2/{name.namespace}/{name.model}"
    manifest = _get_json(
        f"{repo}/manifests/{name.tag}", policy, MAX_MANIFEST_BYTES,
        accept=MANIFEST_ACCEPT, missing=f"pull model manifest: file does not exist "
        f"({name.display} is not in the registry at {base})",
    )  # fmt: skip
    layers = _layers(manifest)
    for kind, why in REFUSED_LAYERS.items():
        if any(layer["mediaType"] == MEDIA + kind for layer in layers):
            raise PullError(f"{name.display} needs {why}", status=400)
    models = [layer for layer in layers if layer["mediaType"] == MODEL_MEDIA]
    if len(models) != 1:
        found = "no model layer" if not models else f"{len(models)} model layers"
        raise PullError(f"the manifest of {name.display} has {found}; expected one", status=400)
    model = models[0]
    blob = Blob(
        url=f"{repo}/blobs/{model['digest']}", digest=model["digest"], size=model["size"],
        filename=f"{name.model}-{name.tag}.gguf",
    )  # fmt: skip
    projectors = [layer for layer in layers if layer["mediaType"] == PROJECTOR_MEDIA]
    if len(projectors) > 1:
        raise PullError(f"the manifest of {name.display} has {len(projectors)} projector "
                        "layers; expected one at most", status=400)  # fmt: skip
    projector = projectors[0] if projectors else None
    small: dict[str, list[str]] = {kind: [] for kind in SMALL_LAYERS}
    read: list[tuple[str, int]] = []
    for layer in layers:
        kind = layer["mediaType"].removeprefix(MEDIA)
        if (
            kind in small
            and layer["size"] <= MAX_SMALL_LAYER_BYTES
            and len(read) < MAX_SMALL_LAYERS
        ):
            small[kind].append(_small_layer(f"{repo}/blobs/{layer['digest']}", layer, policy))
            read.append((layer["digest"], layer["size"]))
    return Plan(
        name=name, blob=blob, source=f"the registry at {base}", layers=tuple(read),
        params=_params(small["params"]), system="\n".join(small["system"]).strip(),
        license="\n".join(small["license"]).strip(),
        projector=Blob(url=f"{repo}/blobs/{projector['digest']}", digest=projector["digest"],
                       size=projector["size"], filename=f"mmproj-{name.model}-{name.tag}.gguf")
        if projector else None,
    )  # fmt: skip


def _layers(manifest) -> list[dict]:
    layers = manifest.get("layers") if isinstance(manifest, dict) else None
    if not isinstance(layers, list):
        raise PullError("the registry sent a manifest without layers")
    for layer in layers:
        ok = (
            isinstance(layer, dict)
            and isinstance(layer.get("mediaType"), str)
            and isinstance(layer.get("digest"), str) and _DIGEST.match(layer["digest"])
            and isinstance(layer.get("size"), int) and not isinstance(layer["size"], bool)
            and layer["size"] >= 0
        )  # fmt: skip
        if not ok:
            raise PullError("the registry sent a manifest with an unreadable layer")
    return layers


def _small_layer(url: str, layer: dict, policy: DownloadPolicy) -> str:
    data = _get_bytes(url, policy, MAX_SMALL_LAYER_BYTES, missing=f"layer {layer['digest']}"
                      " is missing from the registry")  # fmt: skip
    if "sha256:" + hashlib.sha256(data).hexdigest() != layer["digest"]:
        raise PullError(f"the {layer['mediaType']} layer does not match its digest")
    return data.decode("utf-8", errors="replace")


def _params(texts: list[str]) -> dict:
    """The params layers' JSON, merged (the sampling they set is checked at registration)."""
    merged: dict = {}
    for text in texts:
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            merged.update(value)
    return merged


# 2. Hugging Face.


def _hugging_face_plan(name: PullName, policy: DownloadPolicy) -> Plan:
    base = settings.HF_ENDPOINT
    repo = f"{name.namespace}/{name.model}"
    listing = _get_json(
        f"{base}/api/models/{quote(repo)}?blobs=true", policy, MAX_LISTING_BYTES,
        missing=f"{repo} is not a repository on {base} (or it is private)",
        accept="application/json", missing_statuses=(401, 404),  # 401: how HF says "no such repo"
    )  # fmt: skip
    siblings = listing.get("siblings") if isinstance(listing, dict) else None
    if not isinstance(siblings, list):
        raise PullError(f"{base} sent a file list for {repo} without files")
    files = {
        item["rfilename"]: item
        for item in siblings
        if isinstance(item, dict) and isinstance(item.get("rfilename"), str)
        and item["rfilename"].lower().endswith(".gguf")
        and MMPROJ not in item["rfilename"].rsplit("/", 1)[-1].lower()
    }  # fmt: skip
    path = choose_file(sorted(files), name.tag, repo)
    projectors = [item["rfilename"] for item in siblings if isinstance(item, dict)
                  and isinstance(item.get("rfilename"), str)
                  and item["rfilename"].lower().endswith(".gguf")
                  and MMPROJ in item["rfilename"].rsplit("/", 1)[-1].lower()]  # fmt: skip
    projector = choose_mmproj(projectors, path)
    by_name = {item["rfilename"]: item for item in siblings
               if isinstance(item, dict) and isinstance(item.get("rfilename"), str)}  # fmt: skip
    return Plan(name=name, blob=_hf_blob(base, repo, path, by_name[path]), source=f"{base}/{repo}",
                projector=_hf_blob(base, repo, projector, by_name[projector])
                if projector else None)  # fmt: skip


def _hf_blob(base: str, repo: str, path: str, item: dict) -> Blob:
    lfs = item.get("lfs") if isinstance(item.get("lfs"), dict) else {}
    sha = lfs.get("sha256") if isinstance(lfs.get("sha256"), str) else ""
    size = lfs.get("size", item.get("size"))
    return Blob(
        url=f"{base}/{quote(repo)}/resolve/main/{quote(path)}",
        digest=f"sha256:{sha}" if _DIGEST.match(f"sha256:{sha}") else "",
        size=size if isinstance(size, int) and not isinstance(size, bool) else None,
        filename=path.rsplit("/", 1)[-1],
    )  # fmt: skip


def quant_bits(path: str) -> int:
    """The bits of a file name's quant tag, as llama.cpp's extract_quant_bits reads them:
    "x.Q4_K_M.gguf" 4, "mmproj-F16.gguf" 16, no tag 0."""
    stem = _SPLIT_GGUF.sub("", path.rsplit("/", 1)[-1])
    stem = stem[: -len(".gguf")] if stem.lower().endswith(".gguf") else stem
    tag = re.search(r"[-.]([A-Za-z0-9_]+)$", stem)
    bits = re.search(r"\d+", tag.group(1)) if tag else None
    return int(bits.group(0)) if bits else 0


def choose_mmproj(projectors: list[str], model_path: str) -> str | None:
    """The projector for the model file at `model_path`, as llama-server's -hf picks it
    (common/download.cpp, find_best_sibling): one in the model's directory or above it, the
    deepest such directory first, then the quant closest in bits to the model's."""
    model_dir = model_path.split("/")[:-1]
    best: tuple[int, int] | None = None
    chosen = None
    for path in projectors:
        own_dir = path.split("/")[:-1]
        if model_dir[: len(own_dir)] != own_dir:
            continue
        rank = (-len(own_dir), abs(quant_bits(path) - quant_bits(model_path)))
        if best is None or rank < best:
            best, chosen = rank, path
    return chosen


def choose_file(paths: list[str], tag: str, repo: str) -> str:
    """The GGUF of the quant `tag` names (Q4_K_M for "latest"), matched without regard to case
    as a whole word of the file name: Q4_K is not Q4_K_M."""
    quant = DEFAULT_QUANT if tag.lower() == DEFAULT_TAG else tag
    word = re.compile(rf"(?<![A-Za-z0-9]){re.escape(quant)}(?![A-Za-z0-9_])", re.IGNORECASE)
    matching = [p for p in paths if word.search(p.rsplit("/", 1)[-1])]
    if not matching and tag.lower() == DEFAULT_TAG and len(paths) == 1:
        matching = paths  # a repository of one GGUF: that one is the default
    whole = [p for p in matching if not _SPLIT_GGUF.search(p)]
    if matching and not whole:
        raise PullError(f"the {quant} GGUF of {repo} is split into parts, which cannot be "
                        "loaded as one file yet", status=400)  # fmt: skip
    if not whole:
        shown = ", ".join(p.rsplit("/", 1)[-1] for p in paths[:12]) or "none"
        raise PullError(f"{repo} has no GGUF file for {quant}; its GGUF files: {shown}",
                        status=404)  # fmt: skip
    return min(whole, key=lambda p: (len(p), p))  # the plainest name: "x.Q4_K_M.gguf"


# 3. Reading small answers through the guard.


def _get_json(url: str, policy: DownloadPolicy, limit: int, *, missing: str, accept: str,
              missing_statuses: tuple[int, ...] = (404,)):  # fmt: skip
    data = _get_bytes(url, policy, limit, missing=missing, accept=accept,
                      missing_statuses=missing_statuses)  # fmt: skip
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise PullError(f"{_where(url)} did not answer JSON") from None


def _get_bytes(
    url: str,
    policy: DownloadPolicy,
    limit: int,
    *,
    missing: str,
    accept: str = "*/*",
    missing_statuses: tuple[int, ...] = (404,),
) -> bytes:
    try:
        with guarded_get(url, {"Accept": accept}, policy) as response:
            if response.status_code in missing_statuses:
                raise PullError(missing, status=404)
            if response.status_code in (401, 403):
                raise PullError(
                    f"{_where(url)} asks for credentials (HTTP "
                    f"{response.status_code}); only public models can be pulled"
                )
            if response.status_code != 200:
                raise PullError(f"{_where(url)} answered HTTP {response.status_code}")
            data = b""
            for chunk in response.iter_bytes():
                data += chunk
                if len(data) > limit:
                    raise PullError(f"{_where(url)} sent more than {limit} bytes")
            return data
    except AddressRefused as exc:
        raise PullError(str(exc), status=400) from None
    except (DownloadError, *RETRIED) as exc:
        reason = redact_text(str(exc)) or type(exc).__name__
        raise PullError(f"cannot reach {_where(url)}: {reason}") from None
    except httpx.HTTPError as exc:
        raise PullError(f"cannot read from {_where(url)}: {type(exc).__name__}") from None


def _where(url: str) -> str:
    parts = urlsplit(url)
    return f"the server at {parts.scheme}://{parts.netloc}"
