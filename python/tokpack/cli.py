"""The ``tokpack`` command line. Every subcommand lives in ``tokpack/commands/<name>.py`` with an
``add_arguments(parser)`` and a ``run(args) -> int``, and calls the same Python API users import."""

from __future__ import annotations

# Only modules the interpreter has loaded at startup are imported here: everything else is
# imported inside main()'s try, so a Ctrl-C that lands while it loads is handled there.
import os
import sys

from . import __version__
from .errors import TokpackError

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Any, List, Optional

# name -> (module, one-line help). Modules are imported only when their command runs.
COMMANDS = {
    "demo": ("tokpack.commands.demo", "pack a built-in synthetic SFT corpus and print the figures"),
    "pack": ("tokpack.commands.pack", "pack Parquet / Arrow IPC token shards into packed shards"),
    "stats": (
        "tokpack.commands.stats",
        "which max_len: rows and efficiency per candidate length",
    ),
    "inspect": ("tokpack.commands.inspect", "figures and a few rows of a packed directory"),
    "verify": (
        "tokpack.commands.verify",
        "check that a packed directory is intact (exit 2 if not)",
    ),
    "tokenize": ("tokpack.commands.tokenize", "chat / instruction / text files to token shards"),
    "export": ("tokpack.commands.export", "a packed directory to Megatron-LM or NeMo formats"),
}


def build_parser() -> "argparse.ArgumentParser":
    import argparse
    import importlib

    parser = argparse.ArgumentParser(
        prog="tokpack", description="Sequence packing for LLM fine-tuning."
    )
    parser.add_argument("--version", action="version", version=f"tokpack {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in COMMANDS.items():
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        importlib.import_module(module).add_arguments(cmd)
        cmd.set_defaults(_module=module)
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where a Ctrl-C would be, so the same cleanup runs (temporaries removed,
    worker processes and Rust threads stopped)."""


def _on_sigterm(signum: int, frame: Any) -> None:
    import signal

    # A second SIGTERM must not cut the cleanup of the first short.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated()


def main(argv: Optional[List[str]] = None, *, _exiting: bool = False) -> int:
    """Runs one command: exit 0, 2 with one line ``tokpack CMD: error: ...`` on a TokpackError,
    130 on Ctrl-C and 143 on SIGTERM (one line, after the same cleanup), wherever they land,
    imports of the command's modules included."""
    name = "tokpack"
    previous = None
    try:
        import importlib
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGTERM, _on_sigterm)
        args = build_parser().parse_args(argv)
        name = f"tokpack {args.command}"
        return int(importlib.import_module(args._module).run(args) or 0)
    except TokpackError as exc:
        print(f"{name}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader of our output went away (`tokpack stats ... | head`): stop quietly, as
        # command-line tools do, and keep the interpreter's final flush from failing again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell reports a command its pipe ended
    except KeyboardInterrupt as exc:
        terminated = isinstance(exc, Terminated)
        print(f"{name}: {'terminated' if terminated else 'interrupted'}", file=sys.stderr)
        return 143 if terminated else 130
    finally:
        if _exiting:
            _block_late_signals()  # before SIGTERM's default action is back
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def entry() -> None:
    """The ``tokpack`` command (and ``python -m tokpack``): :func:`main`, then exit with its code.

    Once the command has finished, a late Ctrl-C or SIGTERM must not change its outcome: during
    the interpreter's shutdown Python's own handlers are gone (the default action would kill the
    process with no message after the work is complete) or an atexit callback would print a
    traceback. So both are blocked from then on.
    """
    code = 130
    try:
        code = main(_exiting=True)
    except KeyboardInterrupt:  # landed in main()'s last steps: the command is complete
        _block_late_signals()
    sys.exit(code)


def _block_late_signals() -> None:
    import signal  # loaded by main() already

    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})


if __name__ == "__main__":
    entry()
