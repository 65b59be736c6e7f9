"""What the removed edges into a set of receivers carry, in an edge-graph forward whose mask may
be learned (mech.graph.forward.GraphModel.circuit_pass).

With D [R, U, s*d] the first U senders' changes (out_u - rep_u, flattened over positions and
width) and lin [R, U, V] the weight of each removed edge into each of V receivers,

    carried[r, v] = sum_u lin[r, u, v] D[r, u]                      ([R, V, s*d]),

one batched matrix product.  The forward fills D in place, a block of senders at a time, so that
this product reads one buffer; a gradient cannot be taken through a buffer written after it is
read, so where one is wanted (a learned mask) the product is an autograd function that reads the
buffer forward and hands each block of senders its own gradient backward,

    d carried / d lin[r, u, v] = <g[r, v], D[r, u]>,    d carried / d D[r, u] = sum_v lin[r, u, v] g[r, v],

with g the gradient at `carried`.  The buffer's first U rows are never written again once
filled, so what the backward reads is what the forward read.
"""

from __future__ import annotations

from functools import cache
from typing import Any


def carried(lin: Any, D: Any, U: int, blocks: list[Any]) -> Any:
    """[R, V, s*d]: sum over the first U senders of lin [R, U, V] times their changes D[:, :U]
    (the buffer [R, senders, s, d]); `blocks` the tensors D's first U rows were filled from, in
    order (what a gradient flows to; ignored where none is wanted)."""
    import torch

    R, _, s, d = D.shape
    sent = D[:, :U].reshape(R, U, s * d)  # a view: no copy
    wanted = torch.is_grad_enabled() and (lin.requires_grad or any(b.requires_grad for b in blocks))
    if not wanted:
        return torch.bmm(lin.transpose(1, 2), sent)
    return _through_blocks().apply(lin, sent.detach(), *blocks)


@cache
def _through_blocks() -> Any:
    """The autograd function of `carried` (made on first use: torch is imported lazily)."""
    import torch

    class ThroughBlocks(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, lin: Any, sent: Any, *blocks: Any) -> Any:
            ctx.sent = sent  # not saved for backward: later writes to the buffer leave these rows alone
            ctx.shapes = [b.shape for b in blocks]
            ctx.save_for_backward(lin)
            return torch.bmm(lin.transpose(1, 2), sent)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            (lin,) = ctx.saved_tensors
            grad_lin = torch.bmm(ctx.sent, grad.transpose(1, 2)) if ctx.needs_input_grad[0] else None
            whole = torch.bmm(lin, grad)  # [R, U, s*d]
            out, lo = [], 0
            for shape in ctx.shapes:
                out.append(whole[:, lo:lo + shape[1]].reshape(shape))
                lo += shape[1]
            return (grad_lin, None, *out)

    return ThroughBlocks
