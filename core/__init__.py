"""Foundations both sides use: settings, logging, the store, delivery and the outbox, typing."""
