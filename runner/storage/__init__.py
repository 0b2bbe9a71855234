"""Where the subagent side keeps its data on disk: paths, run files, workspaces, and how long it is kept."""
