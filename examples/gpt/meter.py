"""Per-rank compute time, and the slow-device emulation (`--slowdown RANK=FACTOR`).

`rank_seconds` of a step is the time a rank spends in its own forward/backward and
optimizer work, excluding the time it waits in collectives and pipeline send/recv:
every communication call of the client goes through `Meter.comm()`, and the meter
adds up the wall time between them. The step line of the log carries every rank's
value (`"rank_seconds": [...]`, index = global rank); `tenplex run --rebalance` reads
speeds from it.

Emulation, not a slow device: with a factor F > 1 for this rank, every stretch of own
compute (between two communication calls, and up to the end of the step) is followed by
a sleep of (F - 1) x the stretch's measured length before the rank enters the next
collective, so that compute takes F times as long as measured and the other ranks wait
for it at the same points where they would wait for a slower device. The sleeping rank
holds no core, so the emulation does not slow the other ranks of this machine. The
reported `rank_seconds` includes the sleep as it really lasted (what a device F times
slower would show, plus the late wake-ups of a loaded machine, which the other ranks
wait for as well).
This is how the issue's peer (FlexTP) emulates heterogeneity too (it repeats matmuls on
the slow ranks); on a lent GPU a real slower device needs no emulation.
"""

import contextlib
import time
from collections.abc import Callable


def parse_slowdown(specs):
    """{rank: factor} from ["1=2.0", "3=1.5,4=2"]; factors must be >= 1."""
    out = {}
    for spec in specs or []:
        for part in spec.split(","):
            if not part.strip():
                continue
            r, sep, f = part.partition("=")
            try:
                rank, factor = int(r), float(f)
            except ValueError:
                raise ValueError(f"--slowdown {part!r}: expected RANK=FACTOR (e.g. 1=2.0)") from None
            if not sep or rank < 0 or not factor >= 1.0 or factor > 1000:
                raise ValueError(f"--slowdown {part!r}: needs a rank >= 0 and a factor in [1, 1000]")
            out[rank] = factor
    return out


class Meter:
    def __init__(self, factor=1.0):
        self.factor = factor
        self.compute = 0.0  # this step's own compute, sleep included
        self.waited = 0.0  # this step's time inside communication calls
        self._mark = time.perf_counter()
        self._depth = 0
        # Called before each outermost communication call: raises to keep the rank out of
        # a collective its world can no longer finish (train.py: the runner's abort, whose
        # watcher has shut this process's connections; a gloo collective entered on them
        # can hang instead of failing).
        self.before_comm: Callable[[], None] | None = None

    def start_step(self):
        self.compute = self.waited = 0.0
        self._mark = time.perf_counter()

    def _close_stretch(self):
        now = time.perf_counter()
        stretch = now - self._mark
        if self.factor > 1.0 and stretch > 0:
            time.sleep((self.factor - 1.0) * stretch)
            # What the sleep really took (a loaded machine wakes the rank late): the
            # others wait for all of it, so it is this rank's time, not theirs.
            stretch = time.perf_counter() - self._mark
        self.compute += stretch

    @contextlib.contextmanager
    def comm(self):
        """Wraps one communication call: time inside it is waiting, not compute."""
        if self._depth == 0:
            if self.before_comm is not None:
                self.before_comm()
            self._close_stretch()
        self._depth += 1
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                now = time.perf_counter()
                self.waited += now - t0
                self._mark = now

    def end_step(self):
        """Closes the step's last stretch; returns the step's rank seconds."""
        self._close_stretch()
        self._mark = time.perf_counter()
        return self.compute


# The process's meter; train.py sets its factor from --slowdown.
METER = Meter()
