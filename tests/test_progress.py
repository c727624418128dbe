"""The worker-thread runner behind every long command: Ctrl-C must cancel the work and wait for
it to stop before the caller cleans up, or the cleanup races with threads still writing."""

import _thread
import io
import re
import sys
import threading
import time

import pytest

import tokpack
from tokpack._io.progress import _Flag, run_with_progress


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


def _interrupt_at(n: int):
    """A trace function that raises KeyboardInterrupt at the ``n``-th trace event (what a
    Ctrl-C does when it lands on that bytecode boundary); returns it and a counter."""
    seen = [0]

    def trace(frame, event, arg):
        seen[0] += 1
        if seen[0] == n:
            raise KeyboardInterrupt
        return trace

    return trace, seen


def test_a_ctrl_c_anywhere_in_a_wait_leaves_the_flag_usable():
    """A Ctrl-C landing at any point of the caller's wait must not break the flag: the worker's
    set() returns and the next wait sees it (threading.Event fails this: an interrupt right after
    its Condition lock is taken leaks the lock, and a Ctrl-C'd pack hung forever)."""
    n = 1
    while True:
        flag = _Flag()
        trace, seen = _interrupt_at(n)
        interrupted = False
        sys.settrace(trace)
        try:
            flag.wait(0.001)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            sys.settrace(None)
        setter = threading.Thread(target=flag.set, daemon=True)
        setter.start()
        setter.join(2.0)
        assert not setter.is_alive(), f"set() blocked after an interrupt at trace event {n}"
        assert flag.wait(2.0), f"the flag was lost after an interrupt at trace event {n}"
        if not interrupted:
            break  # every event of the wait has had its interrupt
        n += 1
    assert n > 1


def test_a_one_step_pack_draws_one_style(tmp_path, monkeypatch):
    """`pack --tokenizer` shows its tokenize phase and the Rust phases with the same display:
    every line is ``phase [bar] share done/total unit rate/s ETA ...``."""
    pytest.importorskip("tokenizers")
    from ._tokenizer_factory import CHATML_GEN, build_tokenizer, conversations, write_jsonl

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    tok = build_tokenizer(tmp_path / "tok", CHATML_GEN)
    raw = write_jsonl(tmp_path / "chat.jsonl", [{"messages": c} for c in conversations(50)])
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    tokpack.pack_files(raw, tmp_path / "out", 512, overlong="split", tokenizer=tok, progress=True)
    lines = [x.strip() for x in re.split(r"[\r\n]", terminal.getvalue()) if x.strip()]
    style = re.compile(r"^\w+ \[#* *\] +\d+\.\d% \S+/\S+ \w* *\S+/s ETA \S+( [\d,]+ samples)?$")
    assert any(line.startswith("tokenize") for line in lines)
    assert [line for line in lines if not style.match(line)] == []
