"""The ``ckpt`` program (the console script and ``python -m scheduler``): ``ckpt solve``'s time limit armed, then
the CLI imported and run (NOTE [ A limit kept from the first instant ] in ``scheduler.launch``)."""

import sys

from .launch import arm


def program() -> None:
    """``ckpt`` as the console script runs it."""
    arm(sys.argv[1:])
    from .cli import program as run

    run()


if __name__ == "__main__":
    program()
