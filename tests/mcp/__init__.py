"""MCP: the gated server and the gated proxy, driven by the SDK client."""
