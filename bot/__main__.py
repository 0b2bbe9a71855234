"""`python -m bot` is the same as the `crewbot` command."""

from bot.cli import main

raise SystemExit(main())
