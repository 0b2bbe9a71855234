"""Subagent machinery on the host: IPC, watcher, task manager, container runtime, LLM proxy, image."""
