"""The worker-thread runner behind every long command: Ctrl-C must cancel the work and wait for
it to stop before the caller cleans up, or the cleanup races with threads still writing."""

import _thread
import threading
import time

import pytest

from tokpack._progress import run_with_progress


def test_ctrl_c_waits_for_the_work_to_stop():
    finished = threading.Event()

    def work(progress):
        time.sleep(0.2)  # the main thread is now waiting for us
        _thread.interrupt_main()  # Ctrl-C
        time.sleep(0.5)  # still writing
        finished.set()
        return "done"

    with pytest.raises(KeyboardInterrupt):
        run_with_progress(work, show=False)
    # The interrupt surfaced only after the work returned.
    assert finished.is_set()


def test_result_and_errors_come_back_to_the_caller():
    assert run_with_progress(lambda p: 42, show=False) == 42

    def boom(progress):
        raise ValueError("bad shard")

    with pytest.raises(ValueError, match="bad shard"):
        run_with_progress(boom, show=False)
