"""Pulling a model by name, as Ollama's `/api/pull` does.

- names: what a name means (`llama3.2:1b`, `ns/model:tag`, `host/ns/model:tag`, `hf.co/…`).
- sources: where its GGUF comes from: an Ollama registry (manifest, then the model layer by
  digest) or a Hugging Face repository (its file list, then the file of the asked quant).
- pull: the pull job: download (resumable, through inference.catalog.fetching), verify the
  digest, install and register like every GGUF (inference.catalog.importing), under the pulled
  name.
"""
