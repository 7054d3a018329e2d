"""``python -m bench.cprofiled OUT MODULE [ARGS]``: run ``python -m MODULE ARGS`` under
cProfile timed by CPU (``time.process_time``), not wall time, so the event loop's idle waits
count for nothing; the stats go to OUT when the module exits. Used by ``python -m bench
--cprofile DIR`` where py-spy cannot attach (a container without ptrace)."""

from __future__ import annotations

import cProfile
import runpy
import sys
import time


def main() -> int:
    out, module, *rest = sys.argv[1:]
    sys.argv = [module, *rest]
    profile = cProfile.Profile(time.process_time)
    try:
        profile.runcall(runpy.run_module, module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 0
    finally:
        profile.dump_stats(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
