"""Serving memory over MCP: the locked-down Hayhooks server and its bearer auth, the base of the tool
wrappers in `pipelines/`, the stdio bridge and client configurations."""
