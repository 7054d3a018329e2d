"""``python -m bench [ARGS]`` (``make bench``): see ``bench.run`` and ``bench/README.md``."""

from __future__ import annotations

import sys

from bench.run import main
from worker.runtime import logs
from worker.settings import Settings

if __name__ == "__main__":
    settings = Settings()
    logs.configure(settings.log_level, settings.log_format)
    sys.exit(main(settings, sys.argv[1:]))
