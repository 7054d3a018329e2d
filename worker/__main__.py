"""``python -m worker``: the command line of ``worker.cli``."""

from worker.cli import main

raise SystemExit(main())
