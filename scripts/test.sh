#!/usr/bin/env bash
# Set up .venv and run every check: ruff, mypy (strict on the package) and the whole pytest suite
# (unit, integration on a real embedded PostgreSQL + pgvector, end-to-end MCP, notebooks, benchmark
# smoke runs). Extra arguments go to pytest. Any failing check fails the command.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh bench   # the suite also smoke-tests the comparison with mem0
echo "== ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "== mypy"
.venv/bin/mypy
echo "== pytest"
.venv/bin/pytest "$@"
