"""``python -m llmbench.search``: the search's command line (llmbench.search.frontier.main)."""

from .frontier import main

raise SystemExit(main())
