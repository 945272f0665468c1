"""An Ollama registry and a Hugging Face endpoint on loopback, for pull tests: the files of the
registry protocol (manifests and blobs by digest, blobs behind a redirect to a blob store, as
Ollama's registry does it) served by the tests' LAN server, which can also drop a transfer."""

import hashlib
import json

from tests.inference.http_server import ModelServer

MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
MEDIA = "application/vnd.ollama.image."


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class FakeRegistry(ModelServer):
    """A registry (and a Hugging Face endpoint) serving what the test publishes."""

    def __init__(self):
        super().__init__({})
        self.drop_prefix = "store/"  # a dropped connection is a blob's, not a manifest's

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def publish(self, namespace: str, model: str, tag: str, gguf: bytes, *,
                params: dict | None = None, system: str | None = None,
                template: str | None = None, digest: str | None = None,
                projector: bytes | None = None) -> str:  # fmt: skip
        """A manifest for namespace/model:tag with the GGUF as its model layer (under `digest`
        when the test wants a wrong one); returns the model layer's digest."""
        repo = f"v2/{namespace}/{model}"
        layer_digest = digest or digest_of(gguf)
        layers = [self._blob(repo, "model", gguf, layer_digest)]
        if projector is not None:  # a vision model's mmproj, as Ollama's llava manifests have
            layers.append(self._blob(repo, "projector", projector))
        if template is not None:
            layers.append(self._blob(repo, "template", template.encode()))
        if system is not None:
            layers.append(self._blob(repo, "system", system.encode()))
        if params is not None:
            layers.append(self._blob(repo, "params", json.dumps(params).encode()))
        config = self._blob(repo, "config", b"{}")
        manifest = {"schemaVersion": 2, "mediaType": MANIFEST_TYPE, "config": config,
                    "layers": layers}  # fmt: skip
        self.files[f"{repo}/manifests/{tag}"] = json.dumps(manifest).encode()
        return layer_digest

    def _blob(self, repo: str, kind: str, data: bytes, digest: str | None = None) -> dict:
        digest = digest or digest_of(data)
        # The registry redirects a blob to its store, as registry.ollama.ai does.
        self.redirects[f"{repo}/blobs/{digest}"] = f"{self.base}/store/{digest}"
        self.files[f"store/{digest}"] = data
        return {"mediaType": MEDIA + kind, "digest": digest, "size": len(data)}

    def publish_hf(self, repo: str, files: dict[str, bytes]) -> None:
        """A Hugging Face repository: its listing with sizes and LFS hashes, and its files."""
        siblings = [{"rfilename": "README.md"}]
        for path, data in files.items():
            siblings.append({"rfilename": path, "size": len(data), "lfs": {
                "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}})  # fmt: skip
            self.redirects[f"{repo}/resolve/main/{path}"] = f"{self.base}/cdn/{repo}/{path}"
            self.files[f"cdn/{repo}/{path}"] = data
        self.files[f"api/models/{repo}"] = json.dumps({"id": repo, "siblings": siblings}).encode()

    def blob_requests(self) -> list[tuple[str, str | None]]:
        """The blob store's requests: (path, Range header)."""
        return [(path, asked) for path, asked in self.requests if path.startswith("store/")]
