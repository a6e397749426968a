#!/usr/bin/env bash
# Create .venv and install haystack-osa-memory with its offline embedder and dev tools.
# torch is installed first from the CPU wheel on this machine's disk (see docs/traps.md): otherwise
# sentence-transformers pulls a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0" || .venv/bin/python -m pip install -q torch --index-url https://download.pytorch.org/whl/cpu
.venv/bin/python -m pip install -q -e ".[embeddings,dev]"
echo "osa-memory installed in .venv ($(.venv/bin/python -c 'import haystack_osa_memory as m; print(m.__version__)'))"
