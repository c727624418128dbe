"""The ``tokpack`` command line. Every subcommand lives in ``tokpack/commands/<name>.py`` with an
``add_arguments(parser)`` and a ``run(args) -> int``, and calls the same Python API users import."""

from __future__ import annotations

# Only modules the interpreter has loaded at startup are imported here: everything else is
# imported inside main()'s try, so a Ctrl-C that lands while it loads is handled there.
import os
import sys

from ._tokpack import __version__
from .errors import TokpackError

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Any, List, Optional

# name -> one-line help. Command NAME is module tokpack.commands.NAME (with "_" for "-"),
# imported only when the command runs.
COMMANDS = {
    "demo": "pack a built-in synthetic SFT corpus and print the figures",
    "pack": "pack Parquet / Arrow IPC token shards into packed shards",
    "stats": "which max_len: rows and efficiency per candidate length",
    "inspect": "figures and a few rows of a packed directory",
    "verify": "check that a packed directory is intact (exit 2 if not)",
    "tokenize": "chat / instruction / text files to token shards",
    "export": "a packed directory to Megatron-LM or NeMo formats",
    "mix-stats": "what one epoch of a weighted mixture of packed directories delivers",
    "check-model": "whether a config.json's architecture trains exactly on packed batches here",
}


def build_parser() -> "argparse.ArgumentParser":
    import argparse
    import importlib

    parser = argparse.ArgumentParser(
        prog="tokpack", description="Sequence packing for LLM fine-tuning."
    )
    parser.add_argument("--version", action="version", version=f"tokpack {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, help_text in COMMANDS.items():
        module = f"tokpack.commands.{name.replace('-', '_')}"
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        importlib.import_module(module).add_arguments(cmd)
        cmd.set_defaults(_module=module)
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where a Ctrl-C would be, so the same cleanup runs (temporaries removed,
    worker processes and Rust threads stopped)."""


# SIGTERM was received: the interrupt that ends the command is a termination even when what
# reaches main() is a plain KeyboardInterrupt (Ray's ray.get, for one, raises a new one in place
# of the Terminated it caught), or a Terminated Python could only report as "Exception ignored"
# (see _reraise_interrupts).
_late_terminate = [False]
# The command has handled an interrupt: a re-raise scheduled by the hook is not sent.
_handled = [False]


def _reraise_interrupts(previous: Any) -> Any:
    """An ``unraisablehook`` for Ctrl-C and SIGTERM that land in a callback Python cannot raise
    from (a ``__del__``, a weakref callback during an import): instead of printing "Exception
    ignored" and carrying on, the interrupt is raised again in the main thread, where the
    command's cleanup handles it."""

    def hook(unraisable: Any) -> None:
        if unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt):
            import signal
            import threading

            if issubclass(unraisable.exc_type, Terminated):
                _late_terminate[0] = True
            # A real SIGINT to the main thread (it wakes a blocking call), sent from another
            # thread a moment later: raised now, it would land in this hook again. Ignored once
            # the command has finished.
            main = threading.main_thread().ident
            assert main is not None

            def reraise() -> None:
                if not _handled[0]:  # the command may have ended on its own interrupt meanwhile
                    signal.pthread_kill(main, signal.SIGINT)

            threading.Timer(0.01, reraise).start()
            return
        previous(unraisable)

    return hook


def _on_sigterm(signum: int, frame: Any) -> None:
    import signal

    # A second SIGTERM must not cut the cleanup of the first short.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _late_terminate[0] = True
    raise Terminated()


def main(argv: Optional[List[str]] = None, *, _exiting: bool = False) -> int:
    """Runs one command: exit 0, 2 with one line ``tokpack CMD: error: ...`` on a TokpackError,
    130 on Ctrl-C and 143 on SIGTERM (one line, after the same cleanup), wherever they land,
    imports of the command's modules included."""
    name = "tokpack"
    previous = None
    previous_hook = sys.unraisablehook
    sys.unraisablehook = _reraise_interrupts(previous_hook)
    _late_terminate[0] = _handled[0] = False
    try:
        import importlib
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGTERM, _on_sigterm)
        args = build_parser().parse_args(argv)
        name = f"tokpack {args.command}"
        command = importlib.import_module(args._module)
        from ._io.outdir import numpy_api_ready

        numpy_api_ready()
        return int(command.run(args) or 0)
    except TokpackError as exc:
        print(f"{name}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader of our output went away (`tokpack stats ... | head`): stop quietly, as
        # command-line tools do, and keep the interpreter's final flush from failing again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell reports a command its pipe ended
    except (KeyboardInterrupt, Exception) as exc:
        # A Ctrl-C or SIGTERM, or one that C code turned into another error (a SIGTERM while
        # NumPy's C extension imports `datetime` becomes an ImportError): an interrupt all the
        # same.
        interrupt = _interrupt_in(exc)
        if interrupt is None and not _late_terminate[0]:
            raise
        _handled[0] = True
        terminated = isinstance(interrupt, Terminated) or _late_terminate[0]
        print(f"{name}: {'terminated' if terminated else 'interrupted'}", file=sys.stderr)
        return 143 if terminated else 130
    finally:
        if _exiting:
            _ignore_late_signals()  # the hook stays: an interrupt in a late callback is dropped
        else:
            sys.unraisablehook = previous_hook
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)


def _interrupt_in(exc: BaseException) -> Optional[KeyboardInterrupt]:
    """The KeyboardInterrupt (or Terminated) among the causes and contexts of ``exc``."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return None


def entry() -> None:
    """The ``tokpack`` command (and ``python -m tokpack``): :func:`main`, then exit with its code.

    Once the command has finished, a late Ctrl-C or SIGTERM must not change its outcome: during
    the interpreter's shutdown Python's own handlers are gone (the default action would kill the
    process with no message after the work is complete) or an atexit callback would print a
    traceback. So both are ignored from then on.
    """
    code = 130
    try:
        try:
            code = main(_exiting=True)
        finally:
            _ignore_late_signals()
    except KeyboardInterrupt:  # landed in main()'s last steps: the command is complete
        _ignore_late_signals()
    # CPython ends a process by SIGINT instead of with its exit code when a KeyboardInterrupt
    # ever left code run by exec() of a string (dataclasses and namedtuple build their methods
    # that way while a module is imported), even one that was caught later: a Ctrl-C during the
    # imports exited -2, not 130. The flag it keeps is cleared by the next such exec().
    exec("pass")
    sys.exit(code)


def _ignore_late_signals() -> None:
    """SIG_IGN, process-wide: a thread mask would not do (a signal goes to any thread that does
    not block it, and tokpack's Rust and I/O threads are still there), and Python's shutdown
    resets its own handlers to the default action but leaves an ignored signal ignored."""
    import signal  # loaded by main() already

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


if __name__ == "__main__":
    entry()
