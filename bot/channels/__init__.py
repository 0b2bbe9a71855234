"""Channels: the ways messages come in and go out. The core only knows the `Channel` protocol."""
