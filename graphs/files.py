"""Files the project reads and writes: checked before any work, written atomically.

NOTE [ Output files ]
    Every file the project writes (graphs, plans, results) goes through
    :func:`write_text_atomic`: the text is written to a temporary file in the
    same folder, flushed to disk, and renamed over the target with
    ``os.replace``. A write that fails half-way (disk full, quota, Ctrl-C)
    leaves the previous file as it was, never a truncated one. Commands
    check their output paths with :func:`check_output_path` *before* they
    trace or solve, so a missing folder, a folder that cannot be written, a
    directory or a device given as ``-o``, or an output that is one of the
    command's inputs is a one-line error in the first second rather than a
    traceback after the work is done. A name ending in ``.py`` (or another
    Python source suffix) is refused too, and the commands count the files a
    MODEL reads (a factory's module, a config.json) among their inputs
    (``scheduler.commands.common.model_files``): ``ckpt trace mod:build -o
    mod.py`` used to replace the factory's own source with a graph, exit 0.

    An output path that is a symbolic link is written *through*: the file the
    link points to is replaced (atomically, in its own folder) and the link
    stays. ``latest.json -> runs/7/plan.json`` is a link made to follow a
    file; renaming over the link itself (what ``os.replace`` does) used to
    turn it into a plain file and leave its target stale, silently.
    ``tests/scheduler/test_bad_inputs.py``: ``test_output_through_a_symlink_writes_its_target`` and the
    cases "trace -o the factory's source" and "trace -o a link to the factory".
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from typing import Any, Callable, Iterable, Union

from .errors import CkptError

__all__ = ["OutputPathError", "check_output_path", "write_text_atomic", "write_atomic", "read_json", "read_text", "parse_json"]

PathLike = Union[str, "os.PathLike[str]"]

log = logging.getLogger(__name__)

class OutputPathError(CkptError, ValueError):
    """An output path cannot be written (missing folder, a directory, a device, an input)."""


def check_output_path(path: PathLike, *, inputs: Iterable[PathLike] = (), what: str = "output") -> None:
    """Refuse an output path that the final write would fail on or that would destroy an input.

    Probes the folder by creating (and removing) a temporary file in it, so a
    read-only file system or a full quota is seen too, whoever runs it.

    Raises:
        OutputPathError: naming the path and what is wrong with it.
    """
    p = os.fspath(path)
    if not p:
        raise OutputPathError(f"the {what} path is empty")
    if os.path.splitext(p)[1].lower() in SOURCE_SUFFIXES:
        raise OutputPathError(f"{what} {p!r} names a Python file; the output is JSON: give a .json name")
    if os.path.isdir(p):
        raise OutputPathError(f"{what} {p!r} is a directory; give a file name")
    if os.path.lexists(p) and not os.path.isfile(p):
        raise OutputPathError(f"{what} {p!r} exists and is not a regular file (a device, pipe or broken link); "
                              "write to a regular file")
    target = _through_link(p)
    if target != p:
        log.info("%s %s is a symbolic link: writing through it to %s", what, p, target)
    shown = repr(p) if target == p else f"{p!r} (a link to {target!r})"
    for src in inputs:
        if src is not None and os.path.exists(os.fspath(src)) and os.path.exists(target) and os.path.samefile(target, src):
            raise OutputPathError(f"{what} {shown} is also an input of this command; refusing to overwrite it "
                                  "(choose another file name)")
    folder = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(folder):
        raise OutputPathError(f"cannot write {what} {shown}: the folder {folder!r} does not exist")
    if os.path.exists(target) and not os.access(target, os.W_OK):
        raise OutputPathError(f"cannot write {what} {shown}: the file is read-only")
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".ckpt-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise OutputPathError(f"cannot write {what} {shown}: {exc.strerror or exc} (in folder {folder!r})") from None


def write_text_atomic(path: PathLike, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and ``os.replace`` (NOTE [ Output files ]).

    The file gets the permissions of the file it replaces, else the default
    ones (``0o666`` less the umask).

    Raises:
        OutputPathError: the write failed (the previous file is untouched).
    """
    write_atomic(path, lambda fh: fh.write(text.encode("utf-8")))


#: Suffixes of files an output never replaces (NOTE [ Output files ]).
SOURCE_SUFFIXES = (".py", ".pyw", ".pyi", ".pyx", ".ipynb")


def _through_link(p: str) -> str:
    """The file a symbolic link ``p`` points to (NOTE [ Output files ]: written through), else ``p``."""
    return os.path.realpath(p) if os.path.islink(p) else p


def write_atomic(path: PathLike, fill: Callable[[Any], Any]) -> None:
    """Call ``fill(binary_file)`` on a temporary file, then rename it to ``path`` (through a link, to its target)."""
    p = _through_link(os.fspath(path))
    folder = os.path.dirname(os.path.abspath(p))
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(p)}.", suffix=".tmp")
    except OSError as exc:
        raise OutputPathError(f"cannot write {p!r}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fill(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, _mode_for(p))
        os.replace(tmp, p)
    except OSError as exc:
        _discard(tmp)
        raise OutputPathError(f"cannot write {p!r}: {exc.strerror or exc}; the previous file is unchanged") from None
    except BaseException:
        _discard(tmp)
        raise


def _discard(tmp: str) -> None:
    try:
        os.unlink(tmp)
    except OSError:
        pass


def _mode_for(path: str) -> int:
    try:
        return os.stat(path).st_mode & 0o777
    except OSError:
        mask = os.umask(0)
        os.umask(mask)
        return 0o666 & ~mask


def read_json(path: PathLike, *, what: str, error: type[CkptError]) -> Any:
    """Parse the JSON file at ``path``; every failure is one sentence.

    Raises:
        error: the file is missing, a directory, unreadable, not UTF-8, not
            JSON (NaN and Infinity included), or nested too deep to parse.
    """
    p = os.fspath(path)
    return parse_json(read_text(p, what=what, error=error), what=f"{what} file {p!r}", error=error)


def read_text(path: PathLike, *, what: str, error: type[CkptError]) -> str:
    """The UTF-8 text of the file at ``path``; every failure is one sentence (as :func:`read_json`)."""
    p = os.fspath(path)
    try:
        with open(p, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        raise error(f"{what} file {p!r} does not exist") from None
    except IsADirectoryError:
        raise error(f"{what} file {p!r} is a directory; give the JSON file in it") from None
    except OSError as exc:
        raise error(f"cannot read {what} file {p!r}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{what} file {p!r} is not UTF-8 text (byte {exc.start}); is it a JSON file?") from None
    return text


def parse_json(text: str, *, what: str, error: type[CkptError]) -> Any:
    """``json.loads`` with the failures :func:`read_json` names, for text already in memory."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise error(f"{what} is not valid JSON: {exc}") from None
    except ValueError as exc:  # NaN / Infinity
        raise error(f"{what}: {exc}") from None
    except RecursionError:
        raise error(f"{what} nests arrays or objects too deep to be a graph or a plan") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows (sizes and FLOPs are finite integers)")
