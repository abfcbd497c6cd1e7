"""``python -m lightwork``: the command line (see ``lightwork.cli``)."""

from lightwork.cli import main

raise SystemExit(main())
