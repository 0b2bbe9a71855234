"""The run channel: one socket per run, its API and endpoint, the LLM proxy and its policy, budgets and sessions."""
