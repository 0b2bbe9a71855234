"""What the chat side's parts share: the ports the subagent side implements for them (spawning a run,
cancelling runs) and how a run is summed up."""
