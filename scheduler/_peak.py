"""TEMPORARY peak tracker (live storages under a TorchDispatchMode), until scheduler.measure lands."""

from __future__ import annotations

import contextlib
import weakref
from typing import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class _Tracker(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.current = 0
        self.peak_bytes = 0

    def _free(self, key: int) -> None:
        self.current -= self.live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        seen = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)
                and t.device.type != "meta"}
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            st = t.untyped_storage()
            key = st.data_ptr()
            if key in seen or key in self.live or st.nbytes() == 0:
                continue
            self.live[key] = st.nbytes()
            self.current += st.nbytes()
            self.peak_bytes = max(self.peak_bytes, self.current)
            weakref.finalize(st, self._free, key)
        return out


@contextlib.contextmanager
def track_peak() -> Iterator[_Tracker]:
    tracker = _Tracker()
    with tracker:
        yield tracker
