"""Gradients of activations through the backward: the same for every plan.

The gradient rules of NOTE [ Execution model ] (``solvers.model.simulate``), in one
class shared by :func:`~solvers.model.simulate.simulate` and the solvers' own
models (``solvers.dp.profiles``).
"""

from __future__ import annotations

from graphs import Graph

__all__ = ["GradientWalk"]


class GradientWalk:
    """Gradients of activations through the backward (they do not depend on the plan).

    The one implementation of the gradient rules of NOTE [ Execution model ],
    shared by :func:`simulate` and the solvers' own models. Call
    :meth:`start`, then for each node in reverse order :meth:`node_backward`
    (returns the transient bytes of that step; ``bytes`` is then the live
    gradient bytes during it) and :meth:`node_done`.

    NOTE [ View gradients through views ]
        A node that owns no bytes (a view: ``flatten``, ``transpose``) is
        read through the storage of the node that owns it, which is
        therefore among the inputs of the view's readers: the bytes of its
        gradient are counted at the owner, and the view's own gradient is 0
        bytes. When a ``grad_views`` reader (``cat``) hands the owner a view
        of its gradient that way, the views between them do the same in the
        real backward (``transpose``'s backward transposes its gradient),
        so the owner's gradient stays a view of that storage until the
        owner's own backward is done. A zero-byte node with ``grad_views``
        whose gradient is a view therefore hands its zero-byte inputs views
        of the same storage, and an input whose gradient already is a view
        of that storage gets nothing more from it: counting it as a second
        contribution replaced the owner's view by a new tensor and freed
        the ``cat``'s gradient too early. Measured on timm's ViT (the patch
        embedding's ``flatten(2).transpose(1, 2)`` concatenated after the
        class token): the ``[8, 65, 768]`` gradient stays alive through the
        patch convolution's backward, 24,576 bytes (the class token's row)
        above the ``[8, 768, 8, 8]`` that ``simulate`` held instead
        (``tests/regressions/test_timm_vit_patch_grad.py``). Other zero-byte
        nodes keep the rules above: their inputs' gradients are new tensors.
        A zero-byte node merged from several views is such a view when each
        member that hands a gradient to another record does; one that reads
        only parameters (torchvision ViT's ``class_token.expand`` folded with
        the patches' ``reshape`` and ``permute``) has no say: it made
        ``vit_b_16`` measure 6,144 B over every plan
        (``tests/regressions/test_class_token_grad_view.py``).
    """

    def __init__(self, graph: Graph) -> None:
        self.nodes = graph.nodes
        self.preds = graph.preds
        self.out = [nd.out_bytes for nd in graph.nodes]
        self.rg = [nd.requires_grad for nd in graph.nodes]
        n = len(graph.nodes)
        self.alive = [False] * n  # node's gradient exists (own storage or a view)
        self.view_of = [-1] * n  # its gradient is a view of this node's gradient storage
        self.views = [0] * n  # live views on this node's gradient storage
        self._replaced: list[int] = []  # view gradients replaced in the running step
        self.bytes = 0

    def start(self) -> None:
        last = len(self.nodes) - 1
        if self.rg[last]:
            self.alive[last] = True
            self.bytes += self.out[last]

    def node_backward(self, i: int) -> int:
        """Gradients node ``i``'s backward creates for its inputs; returns transient bytes."""
        transient = self.nodes[i].workspace_bytes
        base = self.view_of[i] if self.view_of[i] >= 0 else i
        # NOTE [ View gradients through views ]: a view node handing on a view of its gradient
        passing = self.out[i] == 0 and self.nodes[i].grad_views and self.view_of[i] >= 0
        replacing = 0
        for j in dict.fromkeys(self.preds[i]):
            if not self.rg[j]:
                continue
            if self.alive[j]:
                if passing and self.view_of[j] == base:
                    continue  # the same storage, reached through this view: no second contribution
                transient += self.out[j]  # the contribution, added into the existing gradient
                if self.view_of[j] >= 0:  # a view cannot be added into in place: a new tensor replaces it
                    self._replaced.append(j)
                    replacing += self.out[j]
            elif self.nodes[i].grad_views and self.alive[i] and (self.out[i] > 0 or (passing and self.out[j] == 0)):
                self.alive[j] = True
                self.view_of[j] = base
                self.views[base] += 1
            else:
                self.alive[j] = True
                self.bytes += self.out[j]
        if replacing:
            # NOTE [ Replacing a view gradient ]: ``view + contribution`` runs after
            # node i's function returned (its output gradient and own saved
            # buffers are gone) while the view still holds its base; the new
            # gradient replaces the view when the step ends (node_done).
            released = self.nodes[i].saved_bytes
            if self.alive[i] and self.view_of[i] < 0 and self.views[i] == 0 and i != len(self.nodes) - 1:
                released += self.out[i]
            transient += max(0, replacing - released)
        return transient

    def node_done(self, i: int) -> None:
        """Node ``i``'s backward is over: its output's gradient is released
        (the last node's stays: ``backward()``'s caller holds it to the end)."""
        for j in self._replaced:
            self._drop_view(j)
            self.bytes += self.out[j]
        self._replaced.clear()
        if not self.alive[i]:
            return
        self.alive[i] = False
        if self.view_of[i] >= 0:
            self._drop_view(i)
        elif self.views[i] == 0 and i != len(self.nodes) - 1:
            self.bytes -= self.out[i]

    def _drop_view(self, j: int) -> None:
        b = self.view_of[j]
        self.view_of[j] = -1
        self.views[b] -= 1
        if self.views[b] == 0 and not self.alive[b] and b != len(self.nodes) - 1:
            self.bytes -= self.out[b]
