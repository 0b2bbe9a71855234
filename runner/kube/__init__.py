"""Subagents as Kubernetes Jobs (SUBAGENT_RUNTIME=kubernetes): the runtime, its Job spec and its channel bridge."""
