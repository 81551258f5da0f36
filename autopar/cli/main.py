"""``autopar`` command line: a thin layer over the Python API.

Each subcommand lives in its own module ``autopar.cli.<name>`` exposing ``register(subparsers)``;
heavy imports (torch, ortools) happen inside the command's run function, so ``autopar --help``
and the torch-free commands start fast.

Every way a command can end is one line on stderr, never a traceback:

* a user error (``AutoparError``): ``autopar: error: ...``, exit 2 (argparse's own: exit 2 too);
* Ctrl-C, SIGINT or SIGTERM: ``autopar: interrupted (SIGINT)``, exit 130 (SIGINT) or 143
  (SIGTERM), the shell's 128 + signal number. The handlers are installed even when the signal
  arrives ignored (a background job of a script inherits SIGINT ignored, which let a search run
  on, write its file and exit 0); spawned ranks are terminated; an output file is written
  atomically, so an interrupt leaves none or the old one;
* standard output that cannot be written (``> /dev/full``, a full disk): exit 2; a closed pipe
  (``| head``): exit 0, quietly;
* an OS error, memory running out, an input nested too deeply to read: one line, exit 2;
* a bug in autopar: ``autopar: internal error: ...`` and how to report it, exit 1.

A message is cut to ``costmodels.contracts.checks.MESSAGE_LIMIT`` characters (``shorten``), so a huge bad
value cannot flood the terminal.
"""
from __future__ import annotations

import argparse
import errno
import importlib
import os
import signal
import sys

from costmodels.contracts.checks import shorten
from costmodels.contracts.errors import AutoparError

COMMANDS = ("models", "inspect", "hardware", "estimate", "search", "explain", "export", "apply",
            "verify", "report", "profile", "validate", "checkpoint", "replan", "train")
EXIT_ERROR, EXIT_BUG = 2, 1
# errors of writing standard output: a full disk or /dev/full, a quota, an I/O error, a file too big
OUTPUT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG}


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM, raised in the main thread so that every ``finally`` (temporary files,
    spawned ranks) runs; a KeyboardInterrupt, so code that cleans up after Ctrl-C cleans up after
    SIGTERM too."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_interrupted(signum, frame):
    raise Interrupted(signum)


def install_signal_handlers() -> dict:
    """SIGINT and SIGTERM raise ``Interrupted`` (only the main thread can install handlers);
    returns the handlers they replace, for ``restore_signal_handlers``."""
    saved = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            saved[sig] = signal.signal(sig, _raise_interrupted)
        except (ValueError, OSError):   # not the main thread, or a platform without the signal
            pass
    return saved


def restore_signal_handlers(saved: dict) -> None:
    for sig, handler in saved.items():
        try:
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        except (ValueError, OSError, TypeError):
            pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own errors: one line plus the usage hint
        self.exit(EXIT_ERROR, f"{self.prog}: error: {shorten(message)} (see '{self.prog} --help')\n")

    def _get_values(self, action, arg_strings):
        # argparse drops a '--' value ("--lr=--") and hands the flag an empty list, which no
        # ``type`` then checks: refuse it as the missing value it is
        if action.option_strings and action.nargs is None and arg_strings == ["--"]:
            self.error(f"argument {'/'.join(action.option_strings)}: expected one value, got '--'")
        return super()._get_values(action, arg_strings)


def _version() -> str:
    """The installed distribution's version (the package itself is a higher layer than the CLI)."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("autopar")
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="autopar", description="Automatic parallelism planner for PyTorch training.")
    parser.add_argument("--version", action="version", version=f"autopar {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"autopar.cli.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"autopar.cli.{name}":
                continue  # subcommand not built yet
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    saved = install_signal_handlers()
    try:
        return _run(argv)
    finally:
        restore_signal_handlers(saved)   # main() called from Python (tests) leaves them as found


def _run(argv: list[str] | None) -> int:
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(argv)
        except SystemExit as e:     # --help, or a usage error already printed as one line
            return e.code if isinstance(e.code, int) else EXIT_ERROR
        if not getattr(args, "run", None):
            parser.print_help()
            return EXIT_ERROR
        code = int(args.run(args) or 0)
        sys.stdout.flush()          # a full disk or closed pipe shows here, inside the try
        return code
    except KeyboardInterrupt as e:  # Ctrl-C, or Interrupted (SIGINT / SIGTERM)
        signum = getattr(e, "signum", signal.SIGINT)
    except AutoparError as e:
        return _say(f"error: {e}", EXIT_ERROR)
    except OSError as e:
        return _os_error(e)
    except MemoryError:
        return _say("error: out of memory; use a smaller model, sequence or batch", EXIT_ERROR)
    except RecursionError:          # a JSON / TOML input nested thousands deep, read by a library
        if os.environ.get("AUTOPAR_DEBUG"):
            raise
        return _say("error: an input nests too deeply to read (RecursionError); check the files given "
                    "(if they are ordinary, rerun with AUTOPAR_DEBUG=1 and report it)", EXIT_ERROR)
    except (SystemExit, GeneratorExit):
        raise
    except BaseException as e:  # a bug in autopar (Exception), or what torch raises as a BaseException
        if os.environ.get("AUTOPAR_DEBUG"):
            raise
        if _is_checkpoint_exception(e):
            return _say(f"error: {_checkpoint_message(e)}", EXIT_ERROR)
        return _say(f"internal error: {type(e).__name__}: {_one_line(e)} (rerun with AUTOPAR_DEBUG=1 "
                    "for the traceback and report it)", EXIT_BUG)
    # interrupted; out of the except block, the traceback (and the spawn context it holds) is freed
    stop_children()
    return _say(f"interrupted ({signal.Signals(signum).name})", 128 + signum)


def stop_children(grace_s: float = 1.0) -> None:
    """Stop the ranks this command spawned (verify, validate, profile): SIGTERM reaches only this
    process, and Python's exit would otherwise wait for them to finish their work. SIGINT first,
    so that each rank unwinds and frees what it holds (torch's rank wrapper exits quietly on it),
    then SIGTERM, then SIGKILL."""
    import gc
    import multiprocessing
    import time
    children = multiprocessing.active_children()
    for stop in (lambda p: os.kill(p.pid, signal.SIGINT), lambda p: p.terminate(), lambda p: p.kill()):
        for p in children:
            if p.is_alive():
                try:
                    stop(p)
                except (OSError, ValueError):
                    pass
        deadline = time.monotonic() + grace_s
        for p in children:
            p.join(max(0.0, deadline - time.monotonic()))
        children = [p for p in children if p.is_alive()]
        if not children:
            break
        grace_s = 1.0
    gc.collect()     # the spawn context's queues release their semaphores


def _is_checkpoint_exception(e: BaseException) -> bool:
    """torch.distributed.checkpoint's CheckpointException (a BaseException: ``except Exception``
    misses it), told by its class name so that the CLI does not import torch to check."""
    return any(c.__name__ == "CheckpointException" for c in type(e).__mro__)


def _checkpoint_message(e: BaseException) -> str:
    """One line for a CheckpointException: the first failure of the first rank it holds."""
    failures = getattr(e, "failures", None) or {}
    first = next(iter(failures.values()), None)
    cause = first[0] if isinstance(first, tuple) and first else first
    what = f"{type(cause).__name__}: {_one_line(cause)}" if isinstance(cause, BaseException) else _one_line(e)
    return (f"torch.distributed.checkpoint could not read or write a checkpoint ({what}); a file "
            "in it is damaged or missing: load an earlier checkpoint")


def _one_line(e) -> str:
    return " ".join(str(e).split())


def _say(message: str, code: int) -> int:
    try:
        print(f"autopar: {shorten(message)}", file=sys.stderr)
    except (OSError, ValueError):
        pass
    return code


def _os_error(e: OSError) -> int:
    """Standard output that cannot take the output (a closed pipe: quietly; a full disk,
    /dev/full: one line), or an OS error of the user's environment, as one line. An error
    writing a stream carries no file name; one on a file the user named does."""
    if isinstance(e, BrokenPipeError) or e.errno == errno.EPIPE:
        _silence_stdout()
        return 0
    if e.filename is None and e.errno in OUTPUT_ERRNOS:
        _silence_stdout()
        return _say(f"error: cannot write the output ({e.strerror or e}); redirect it to a file on a "
                    "disk with free space", EXIT_ERROR)
    where = f" '{e.filename}'" if e.filename else ""
    return _say(f"error: {e.strerror or e}{where}; check the path, its permissions and free space",
                EXIT_ERROR)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that Python's exit-time flush does not print a traceback."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
