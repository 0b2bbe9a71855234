"""What every part of the subagent side shares about a run: the runs live right now, and how an outcome reads."""
