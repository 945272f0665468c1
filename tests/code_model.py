"""A code model for the fill-in-the-middle tests: the starter model with FIM token ids in its
header, written by the gguf package's gguf-new-metadata, as an admin would mark a model.

SmolLM2's vocabulary has no FIM tokens of its own; its special tokens 8, 9 and 10 serve as the
prefix, suffix and middle tokens, 5 (<file_sep>) as the file separator, and llama.cpp finds its
repo token (<reponame>, 4) by its text. Its answers mean nothing, but are deterministic at
temperature 0, which is all a comparison of layouts and answers needs."""

import subprocess
import sys
from pathlib import Path

FIM_IDS = {"fim_pre": 8, "fim_suf": 9, "fim_mid": 10, "fim_sep": 5}
REPO_ID = 4


def write_code_model(starter: Path, target: Path) -> Path:
    marks = [arg for role, token in FIM_IDS.items()
             for arg in ("--special-token-by-id", role, str(token))]  # fmt: skip
    subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", *marks, "--force",
                    str(starter), str(target)], check=True, capture_output=True)  # fmt: skip
    return target
