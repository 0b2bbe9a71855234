"""`python -m crewbot` is the same as the `crewbot` command."""

from crewbot.cli import main

raise SystemExit(main())
