"""``python -m bench.profiled_service OUT MODULE``: run MODULE as ``__main__``, profiling a window.

cProfile is enabled on SIGUSR1 and written to OUT on SIGUSR2, so the profile
covers the measured work and not the service's imports and start-up.
"""

from __future__ import annotations

import cProfile
import runpy
import signal
import sys
from types import FrameType


def main() -> None:
    out, module = sys.argv[1], sys.argv[2]
    sys.argv = [module]
    profiler = cProfile.Profile()

    def enable(_signum: int, _frame: FrameType | None) -> None:
        profiler.enable()

    def dump(_signum: int, _frame: FrameType | None) -> None:
        profiler.disable()
        profiler.dump_stats(out)

    signal.signal(signal.SIGUSR1, enable)
    signal.signal(signal.SIGUSR2, dump)
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
