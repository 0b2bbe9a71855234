"""The turn engine: one main-agent turn per chat at a time, chats in parallel, and the merge window."""
