#!/usr/bin/env bash
# Create .venv and install haystack-osa-memory with its offline embedder and dev tools.
# Extra extras as arguments: `bash scripts/setup.sh bench` adds mem0 for benchmarks/vs_mem0.py.
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
extras="embeddings,dev"
for extra in "$@"; do extras="$extras,$extra"; done
pipq -e ".[$extras]"
echo "osa-memory installed in .venv ($(.venv/bin/python -c 'import haystack_osa_memory as m; print(m.__version__)'))"
