#!/usr/bin/env bash
# Set up .venv and run a working MCP memory server on the embedded default (no database to install).
# Prints a demo token (org "demo", assignment "demo-assignment", valid 8 hours) and the MCP client config.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PORT="${PORT:-1417}"
.venv/bin/osa-memory init
TOKEN="$(.venv/bin/osa-memory token create --org demo --assignment demo-assignment --expires-in 8h)"
cat <<MSG

MCP endpoint: http://127.0.0.1:${PORT}/mcp
Demo token (org demo, assignment demo-assignment, 8 hours):
  ${TOKEN}
Client config (.mcp.json):
{"mcpServers": {"osa-memory": {"type": "http", "url": "http://127.0.0.1:${PORT}/mcp",
  "headers": {"Authorization": "Bearer ${TOKEN}"}}}}

MSG
exec .venv/bin/osa-memory serve --port "${PORT}"
