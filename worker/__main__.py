"""``python -m worker``: the command line of ``worker.cli``."""

from worker.runtime.early_stop import exit_on_sigterm_while_starting

exit_on_sigterm_while_starting()  # before the imports below, which take most of a start

from worker.cli import main  # noqa: E402

raise SystemExit(main())
