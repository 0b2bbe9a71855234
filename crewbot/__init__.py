"""The composition root: builds everything, runs it from the command line. Nothing imports it."""
