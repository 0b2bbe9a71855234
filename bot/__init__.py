"""crewbot: the host process (settings, store, channels, chat turn engine, main agent, CLI)."""
