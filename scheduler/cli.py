"""``ckpt``: the command line. Each subcommand lives in ``scheduler/commands/``.

A subcommand module defines ``NAME``, ``HELP``, ``add_arguments(parser)`` and
``run(args) -> int`` (the exit status).

NOTE [ How the CLI fails ]
    A user's mistake is one line on stderr and exit status 2, never a
    traceback: errors the project raises on purpose (:class:`graphs.CkptError`)
    and argparse's own (bad flag, bad value: one line too, not the usage
    block). Ctrl-C at any moment prints ``interrupted`` and exits 130; output
    files are written atomically at the end, so an interrupted run leaves
    them as they were (NOTE [ Output files ] in ``graphs.files``). A closed
    stdout (``ckpt solve ... -o plan.json | head -1``) does not stop the
    command: further output is dropped and the files are still written.
    Anything else keeps its traceback: it is a bug.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import time
from typing import Any, NoReturn

from graphs import CkptError

from .launch import disarm

__all__ = ["main", "COMMANDS"]

#: Subcommand modules, in the order ``ckpt --help`` lists them.
COMMANDS = ["models", "trace", "solve", "simulate", "apply", "compare", "fit", "demo", "calibrate"]


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (NOTE [ How the CLI fails ])."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="ckpt",
        description="Plan activation checkpointing for PyTorch training: trace a model into a cost graph, "
        "solve which activations to keep under a memory budget, apply the plan and verify it.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-v info, -vv debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        try:
            mod = importlib.import_module(f"scheduler.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"scheduler.commands.{name}":
                continue  # not built yet
            raise
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=getattr(mod, "DESCRIPTION", mod.HELP),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


class _PipeSafeStdout:
    """stdout that, once its reader has gone (``BrokenPipeError``), drops what is written instead of failing."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.broken = False

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                return self.stream.write(text)
            except BrokenPipeError:
                self._close()
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self.stream.flush()
            except BrokenPipeError:
                self._close()

    def _close(self) -> None:
        self.broken = True
        try:  # what is still buffered goes nowhere, also at interpreter exit
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def process_age_s() -> float:
    """Seconds since this process started (``scheduler.launch.process_age_s``)."""
    from .launch import process_age_s as age

    return age()


#: Commands after which the program ends without Python's teardown (NOTE [ The command's time limit ]).
QUICK_EXIT = frozenset({"solve"})
_RAN: list[str] = []  # the command main() ran last (for program())


def program() -> None:
    """The ``ckpt`` program: :func:`main` on ``sys.argv``, then the exit; after a command of
    :data:`QUICK_EXIT`, once its output is flushed, without Python's teardown (collecting a CP-SAT model,
    unloading OR-Tools and numba: 1-4 s past a time limit at a load of 8; NOTE [ The command's time limit ])."""
    rc = main()
    if _RAN and _RAN[-1] in QUICK_EXIT:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001  (a closed stream: nothing more to write)
                pass
        os._exit(rc)
    sys.exit(rc)


def main(argv: list[str] | None = None) -> int:
    """Run ``ckpt`` with ``argv``; the exit status (NOTE [ How the CLI fails ])."""
    stdout = sys.stdout
    sys.stdout = _PipeSafeStdout(stdout)  # type: ignore[assignment]
    command = ""
    _RAN.clear()
    try:
        parser = build_parser()
        # NOTE [ One deadline ]: run as the program (argv None), the command's time limit also covers the
        # process's start and imports; called with argv (tests, a caller's process), from here on
        started, before = time.monotonic(), process_age_s() if argv is None else 0.0
        args = parser.parse_args(argv)
        disarm()  # NOTE [ A limit kept from the first instant ]: the command's own deadline takes over
        args._argv = list(sys.argv[1:] if argv is None else argv)  # which flags were given (fit's assumptions)
        args._spent = lambda: before + time.monotonic() - started  # seconds this command has run
        command = args.command or ""
        _RAN.append(command)
        _configure_logging(args.verbose)
        if not getattr(args, "_run", None):
            parser.print_help()
            return 1
        return int(args._run(args) or 0)
    except CkptError as exc:
        text = " ".join(str(exc).split())  # one line, whatever the message holds
        print(f"ckpt {command}: error: {text}" if command else f"ckpt: error: {text}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except SystemExit as exc:  # argparse: --help (0) or a bad flag (2, its line already printed)
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
    finally:
        try:
            sys.stdout.flush()
        except Exception:  # noqa: BLE001  (a closed stdout must not turn into an error here)
            pass
        sys.stdout = stdout


def _configure_logging(verbose: int) -> None:
    """Warnings (or -v info, -vv debug) for the libraries; progress lines always (``scheduler.progress``)."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    logging.captureWarnings(True)  # a library warning is one line on stderr, like the rest
    from .progress import enable

    enable()


if __name__ == "__main__":
    program()
