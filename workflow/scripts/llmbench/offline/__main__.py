"""``python -m llmbench.offline``: the planner's command line (llmbench.offline.cli.main)."""

from .cli import main

raise SystemExit(main())
