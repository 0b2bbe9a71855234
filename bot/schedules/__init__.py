"""Scheduled tasks on the chat side: when they are due (scheduler), what a due time does (firing), and
what chats and the main agent may ask of them (book)."""
