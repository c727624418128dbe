"""The command line: ``tokpack demo`` and error reporting."""

import os
import signal
import subprocess
import sys
import time

import pytest

from tokpack.cli import main

from ._interrupt import interrupt_after_first_shard


def test_demo_prints_a_row_per_strategy(capsys):
    assert main(["demo", "--samples", "2000", "--max-len", "2048"]) == 0
    out = capsys.readouterr().out
    for strategy in ("bfd", "ffd", "next_fit", "padding", "random"):
        assert f"| {strategy} " in out
    assert "lower bound" in out


def test_entry_point_runs_as_a_module():
    proc = subprocess.run(
        [sys.executable, "-m", "tokpack", "demo", "--samples", "500"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "efficiency" in proc.stdout


def test_config_errors_exit_non_zero_without_traceback(capsys):
    assert main(["demo", "--samples", "100", "--max-len", "0"]) == 2
    err = capsys.readouterr().err
    assert "max_len must be at least 1" in err and "Traceback" not in err


# Ctrl-C while the modules import: a finder raising KeyboardInterrupt at the first import of
# numpy or pyarrow (where a Ctrl-C in the first few hundred ms lands), then what the `tokpack`
# console script does.
_INTERRUPTED_IMPORT = """
import sys
import time

class Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name in ("numpy", "pyarrow"):
            raise KeyboardInterrupt
        return None

sys.meta_path.insert(0, Interrupt())
sys.argv = ["tokpack", "demo", "--samples", "100"]
from tokpack.cli import main
sys.exit(main())
"""


def test_ctrl_c_during_imports_is_one_line_exit_130():
    # `import tokpack` used to import numpy and pyarrow before cli.main could catch anything.
    proc = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_IMPORT], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr == "tokpack: interrupted\n"


def test_sigterm_during_pack_cleans_up_like_ctrl_c(tmp_path):
    from tokpack.synthetic import write_token_shards

    corpus = tmp_path / "corpus"
    write_token_shards(corpus, 2000, n_files=2, max_length=900, row_group_rows=500, seed=5)
    out = tmp_path / "out"
    args = ["pack", str(corpus), "-o", str(out), "--quiet", "--overlong", "split"]
    args += ["--rows-per-shard", "64", "--row-group-rows", "16", "--threads", "1"]
    returncode, err = interrupt_after_first_shard(args, out, signal.SIGTERM)
    assert returncode == 143, err
    assert err == "tokpack pack: terminated\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]


def test_sigterm_is_143_when_a_library_turns_it_into_a_plain_keyboardinterrupt(monkeypatch, capsys):
    """Ray's ray.get catches the Terminated our SIGTERM handler raises and raises a new
    KeyboardInterrupt: that run exited 130, "interrupted" (test_ray's SIGTERM test, now and
    then under load). A SIGTERM received makes the end a termination whatever reaches main."""
    import tokpack.commands.verify as verify_command
    from tokpack.cli import main

    def run(args):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        except KeyboardInterrupt:
            raise KeyboardInterrupt() from None  # what the library does with it
        return 0

    monkeypatch.setattr(verify_command, "run", run)
    assert main(["verify", "anything"]) == 143
    assert capsys.readouterr().err == "tokpack verify: terminated\n"


def test_a_closed_output_pipe_ends_quietly():
    # `tokpack demo | head -1`: the reader goes away after one line.
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokpack", "demo", "--samples", "2000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read()
    proc.wait(timeout=60)
    assert proc.returncode == 128 + signal.SIGPIPE, err
    assert err == ""


# A Ctrl-C that lands in a __del__ (or a weakref callback during an import) cannot propagate;
# Python would print "Exception ignored" and carry on with the command.
_INTERRUPT_IN_DEL = """
import sys, time
import tokpack.commands.demo as demo

class Bomb:
    def __del__(self):
        raise KeyboardInterrupt

def run(args):
    Bomb()
    time.sleep(5)
    print("carried on")
    return 0

demo.run = run
sys.argv = ["tokpack", "demo"]
from tokpack.cli import entry
entry()
"""


def test_an_interrupt_inside_a_callback_still_interrupts():
    proc = subprocess.run(
        [sys.executable, "-c", _INTERRUPT_IN_DEL], capture_output=True, text=True, check=False
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (130, "", "tokpack demo: interrupted\n")


# A Ctrl-C that lands in code run by exec() of a string (a dataclass being built while a
# command's module is imported) and propagates from there to main(): handled, exit 130. CPython
# used to remember it and end the process by SIGINT (-2) after main() had returned 130.
_INTERRUPT_IN_EXEC = """
import sys
import tokpack.commands.demo as demo

def run(args):
    exec("raise KeyboardInterrupt")

demo.run = run
sys.argv = ["tokpack", "demo"]
from tokpack.cli import entry
entry()
"""


def test_an_interrupt_inside_exec_code_exits_130(tmp_path):
    # Run with -m, as `python -m tokpack` is: a script file's SystemExit exits at once.
    (tmp_path / "interrupt_in_exec.py").write_text(_INTERRUPT_IN_EXEC)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    proc = subprocess.run(
        [sys.executable, "-m", "interrupt_in_exec"],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    assert (proc.returncode, proc.stderr) == (130, "tokpack demo: interrupted\n")


_SIGNALS_AFTER_MAIN = """
import signal, sys
from tokpack import cli
code = cli.main(["demo", "--samples", "200"], _exiting=True)
print(code, signal.getsignal(signal.SIGINT) is signal.SIG_IGN,
      signal.getsignal(signal.SIGTERM) is signal.SIG_IGN)
"""


def test_signals_are_ignored_once_the_command_has_finished():
    # Blocking them in the main thread would not do: a signal goes to any thread that does not
    # block it (tokpack's Rust threads), and Python's shutdown resets its own handlers.
    proc = subprocess.run(
        [sys.executable, "-c", _SIGNALS_AFTER_MAIN], capture_output=True, text=True, check=False
    )
    assert proc.stdout.splitlines()[-1] == "0 True True", proc.stderr


def test_sigterm_that_c_code_turns_into_an_import_error_is_143(monkeypatch, capsys):
    """A SIGTERM landing while NumPy's C extension imports `datetime` reached main() as an
    ImportError ("PyCapsule_Import could not import module datetime"): the run exited 1 with a
    traceback (test_interruptions, run 13, under load). A received SIGTERM ends it as 143."""
    import tokpack.commands.verify as verify_command
    from tokpack.cli import main

    def run(args):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        except KeyboardInterrupt as exc:
            raise ImportError("PyCapsule_Import could not import module 'datetime'") from exc
        return 0

    monkeypatch.setattr(verify_command, "run", run)
    assert main(["verify", "anything"]) == 143
    assert capsys.readouterr().err == "tokpack verify: terminated\n"


def test_an_error_chained_from_ctrl_c_is_130_and_other_errors_still_raise(monkeypatch, capsys):
    import tokpack.commands.verify as verify_command
    from tokpack.cli import main

    def interrupted(args):
        try:
            raise KeyboardInterrupt()
        except KeyboardInterrupt as exc:
            raise ImportError("a C extension failed") from exc

    monkeypatch.setattr(verify_command, "run", interrupted)
    assert main(["verify", "anything"]) == 130
    assert capsys.readouterr().err == "tokpack verify: interrupted\n"

    def broken(args):
        raise ImportError("a real bug")

    monkeypatch.setattr(verify_command, "run", broken)
    with pytest.raises(ImportError, match="a real bug"):
        main(["verify", "anything"])
