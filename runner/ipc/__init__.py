"""The IPC folders: spawn-request files, how they are written, scanned, checked in batches and watched."""
