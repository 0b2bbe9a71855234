"""The main agent: prompt from the store, the configured LLM, and the spawn_subagent tool."""
