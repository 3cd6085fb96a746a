#!/usr/bin/env bash
# scripts/torch-venv.sh VENV — makes VENV a virtual environment with the PyPI torch (its CUDA
# build: the CPU wheels lack c10_cuda, which libstitch_torch links), unless it has one already.
# Kept outside the clone and reused by later runs (scripts/test.sh passes
# ${STITCH_TORCH_VENV:-~/.cache/stitch/torch-venv}). STITCH_TORCH_SPEC picks the release
# (default: the one the native backend was last checked against). No GPU is needed.
set -euo pipefail
venv=${1:?usage: torch-venv.sh VENV}
spec=${STITCH_TORCH_SPEC:-torch==2.15.0}
has_cuda_torch() {
  [ -x "$venv/bin/python" ] &&
    "$venv/bin/python" -c "import torch, sys; sys.exit(0 if torch.version.cuda else 1)" >/dev/null 2>&1
}
if has_cuda_torch; then
  echo "torch-venv: $venv has torch $("$venv/bin/python" -c 'import torch; print(torch.__version__)')"
  exit 0
fi
python=/usr/bin/python3
[ -x "$python" ] || python=$(command -v python3)
echo "torch-venv: installing $spec into $venv (a few GB, once)"
mkdir -p "$(dirname "$venv")"
# A link left pointing at nothing (a venv made elsewhere and since removed) would stop venv.
if [ -L "$venv" ] && [ ! -e "$venv" ]; then
  echo "torch-venv: $venv links to $(readlink "$venv"), which is gone: replacing the link"
  rm -f "$venv"
fi
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q "$spec" numpy
has_cuda_torch || { echo "torch-venv: $venv has no CUDA build of torch" >&2; exit 1; }
