"""The block arithmetic: one implementation of a transformer block as harness computes it by hand.

`arith` (masks, attention, rotation, norms, dense maps, whole blocks), `rotary` (each layer's
rotation table from the model's own rotary embedding), `read` (a bridge's weights read into that
arithmetic, in any dtype), `fidelity` (the arithmetic held to the model's own activations on every
run) and `attention` (one head's attention by hand in float64, for exact edge and path patching).
Every path that recomputes part of a forward pass (exact and batched edges, paths, the edge graph,
attribution, ablations from a layer on) calls these functions; nothing else in `mech/` writes a
mask, a softmax, a rotation or a norm.
"""
