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
pipq() { .venv/bin/python -m pip install -q --disable-pip-version-check "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }
pipq "torch==2.13.0"
pipq -e ".[embeddings,dev,bench]"
echo "osa-memory installed in .venv ($(.venv/bin/python -c 'import haystack_osa_memory as m; print(m.__version__)'))"
