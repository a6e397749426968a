#!/usr/bin/env bash
# Set up .venv and run every check: ruff, mypy (strict on the package) and the whole pytest suite
# (unit, integration on a real embedded PostgreSQL + pgvector, end-to-end MCP, notebooks, benchmark
# smoke runs). Extra arguments go to pytest. Any failing check fails the command.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh bench   # the suite also smoke-tests the comparison with mem0
# Debian packages the suite drives: chromium and its driver (the review console's browser tests) and wrk
# (the load benchmark's near-free client). Never skipped: when they cannot be installed, those tests fail.
missing=""
command -v chromium >/dev/null || missing="$missing chromium"
command -v chromedriver >/dev/null || missing="$missing chromium-driver"
command -v wrk >/dev/null || missing="$missing wrk"
if [ -n "$missing" ]; then
  echo "== installing$missing"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  # shellcheck disable=SC2086 # one word per package
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
fi
if [ ! -f tests/e2e/console/node_modules/axe-core/axe.min.js ]; then
  echo "== installing axe-core"
  npm ci --prefix tests/e2e/console --no-audit --no-fund
fi
echo "== ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "== mypy"
.venv/bin/mypy
echo "== pytest"
.venv/bin/pytest "$@"
