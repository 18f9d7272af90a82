"""The restore of a new world started while its process group forms (tenplex.member's
MemberJob.rejoin(), issue 37), and the end of a pre-size before it."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from ._job_state import JobState

if TYPE_CHECKING:
    from .member import Presize

ENV_NO_EARLY_RESTORE = "TENPLEX_NO_EARLY_RESTORE"  # set (not "" or "0"): restore() coordinates (A/B baseline)


class EarlyRestore:
    """Rank 0 of a new world, from rejoin(): the restore's coordination (the recovery, the
    job's lease, the transform onto the world's daemons; Job._guarded_restore) in a
    background thread while the process group forms, instead of after it. The world
    record names every host's daemon in group-rank order, so nothing of it needs the
    group; restore() takes the record if the daemons it gathers are those (else it
    coordinates again). A pending pre-size is finished first, as rejoin() did."""

    def __init__(self, job: JobState, epoch: int, urls: list[str], presize: Presize | None):
        self.urls, self.epoch, self._presize = urls, epoch, presize
        self.record: dict = {}
        self.seconds = 0.0
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(job,), name="tenplex-early-restore", daemon=True)
        self._t0 = time.perf_counter()
        self._thread.start()

    def _run(self, job: JobState) -> None:
        try:
            if self._presize is not None:  # done before the transform takes its files
                finish_presize(job, self._presize, self.epoch)
            self.record = job._guarded_restore(self.urls)
        except BaseException as e:  # noqa: BLE001 - raised again in the main thread (result())
            self._error = e
        self.seconds = time.perf_counter() - self._t0

    def wait(self) -> float:
        """Waits for the thread; the seconds waited."""
        t0 = time.perf_counter()
        self._thread.join()
        return time.perf_counter() - t0

    def result(self) -> dict:
        """The record (after wait()); what the coordination raised beyond its errors, raised."""
        if self._error is not None:
            raise self._error
        return self.record


def finish_presize(job: JobState, presize: Presize, epoch: int) -> None:
    """Waits for a pre-size (Presize.finish) and logs its outcome as rank 0's "presize" event."""
    job._log_event({"event": "presize", "epoch": epoch, **presize.finish()})
