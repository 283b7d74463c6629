"""``python -m llmbench.search``: the search's command line (llmbench.search.runner.main)."""

from .runner import main

raise SystemExit(main())
