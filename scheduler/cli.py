"""``ckpt``: the command line. Each subcommand lives in ``scheduler/commands/``.

A subcommand module defines ``NAME``, ``HELP``, ``add_arguments(parser)`` and
``run(args) -> int`` (the exit status). Errors the project raises on purpose
(:class:`graphs.CkptError`) are printed as one sentence, exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from graphs import CkptError

__all__ = ["main", "COMMANDS"]

#: Subcommand modules, in the order ``ckpt --help`` lists them.
COMMANDS = ["models", "trace", "solve", "simulate", "apply", "compare", "fit", "demo"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ckpt",
        description="Plan activation checkpointing for PyTorch training: trace a model into a cost graph, "
        "solve which activations to keep under a memory budget, apply the plan and verify it.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-v info, -vv debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING if args.verbose == 0 else logging.INFO if args.verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "_run", None):
        parser.print_help()
        return 1
    try:
        return int(args._run(args) or 0)
    except CkptError as exc:
        print(f"ckpt {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
