"""``ckpt models``: the example models and their options."""

from __future__ import annotations

import argparse

from ..report import table

NAME = "models"
HELP = "list the built-in example models (and hf:NAME configs) with their options"
DESCRIPTION = """List the models `ckpt trace MODEL` (and solve, apply, compare, fit) accept.

MODEL is a built-in name, hf:NAME (a transformers config, random weights,
offline), or package.module:factory (a function returning (model, args, kwargs)
or (model, args, kwargs, loss)). Options are set with flags: --batch, --seq,
--image-size, --dtype, --layers, --width, --device, or --option key=value.

example:
  ckpt models"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    from ..models import describe

    rows = []
    for name, desc, opts in describe():
        shown = ", ".join(f"{k}={getattr(v, '__name__', None) or str(v).replace('torch.', '')}"
                          for k, v in opts.items())
        rows.append((name, desc, shown))
    print(table(rows, ["model", "description", "options (defaults)"]))
    return 0
