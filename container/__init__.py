"""What runs inside a subagent container: its agent loop and tools. Never imports `bot`."""
