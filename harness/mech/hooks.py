"""Interventions as data, applied inside `run_plan`, which always leaves the
model as it found it (TransformerLens removes the hooks on exit, even on error)
and checks that every hook fired.

MLP ablation (`mlp_ablation_plan`) replaces `blocks.L.hook_mlp_out` the same three ways.
Head ablation acts on `blocks.L.attn.hook_z` (the head's attention-weighted
values, before W_O), replacing only that head's slice:

* zero:     z_h <- 0                       (b_O is shared by all heads and kept)
* mean:     z_h[n, p] <- mean_m z_h^ref[m, p]   per position over reference prompts
            other than n (mech.runs.reference.Reference; fixed length required)
* resample: z_h[n, p] <- z_h^corrupted[n, p]    (the paired corrupted prompt)

The head's output is then z_h W_O^h, so its contribution to every later
reader changes; every other head is untouched.  Tokens are moved to the
model's device before a forward; replacement values come from caches on it.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from .. import cost, memory
from ..errors import SanityCheckError
from ..model import architecture, metrics
from ..model.bridge import Bridge
from ..model.devices import of
from ..model.shape import vocab_out
from ..progress import progress
from ..spec.names import (
    HOOK_POS_EMBED,
    Head,
    Mlp,
    hook_attn_sum,
    hook_layer,
    hook_mlp_out,
    hook_resid_mid,
    hook_resid_pre,
    hook_z,
)
from ..spec.vocabulary import ABLATIONS, Ablation
from .block import rotary
from .block.arith import causal, output_transform

if TYPE_CHECKING:
    from jaxtyping import Float, Int
    from torch import Tensor

Cache = dict[str, "Tensor"]  # hook name -> activations of one run (and "logits")


@dataclass
class Plan:
    """A list of (hook name, function) pairs to apply during one forward."""

    hooks: list[tuple[str, Callable[..., Any]]] = field(default_factory=list)

    def add(self, name: str, fn: Callable[..., Any]) -> None:
        self.hooks.append((name, fn))


def run_plan(bridge: Bridge, tokens: Int[Tensor, "n pos"], plan: Plan) -> Float[Tensor, "n pos vocab"]:
    """Forward `tokens` (moved to the model's device) with the plan's hooks; raise if
    any hook never fired."""
    import torch

    hooks, fired = _counted(bridge, plan)
    try:
        with torch.no_grad():
            logits = bridge.run_with_hooks(tokens.to(of(bridge)), fwd_hooks=list[tuple[Any, Callable[..., Any]]](hooks))
    except ValueError as exc:
        if "Cannot add hook" in str(exc):  # TransformerLens refuses gated hooks
            raise SanityCheckError(str(exc)) from None
        raise
    _check_fired(plan, fired)
    cost.spend(tokens.shape[0])
    return cast("Tensor", logits)


def _counted(bridge: Bridge, plan: Plan) -> tuple[list[tuple[str, Callable[..., Any]]], list[int]]:
    """The plan's hooks wrapped to count their calls, and the counts; unknown hook names are an error."""
    unknown = [name for name, _ in plan.hooks if name not in bridge.hook_dict]
    if unknown:
        raise SanityCheckError(f"the model has no hook named {', '.join(unknown)}")
    fired = [0] * len(plan.hooks)

    def counting(i: int, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(x: Any, hook: Any) -> Any:
            fired[i] += 1
            return fn(x, hook)
        return wrapped

    return [(name, counting(i, fn)) for i, (name, fn) in enumerate(plan.hooks)], fired


def _check_fired(plan: Plan, fired: list[int]) -> None:
    """Raise if a hook of the plan never fired: the intervention did not happen."""
    silent = [plan.hooks[i][0] for i, n in enumerate(fired) if n == 0]
    if silent:
        raise SanityCheckError(f"hook(s) never fired: {', '.join(silent)}; the intervention "
                               "did not happen (is this hook supported by the model?)")


def first_layer(plan: Plan) -> int | None:
    """The lowest block index a plan's hooks touch (`blocks.N.` names), or None if a hook sits
    outside the blocks (e.g. the embedding) or the plan is empty."""
    layers = []
    for name, _ in plan.hooks:
        parts = name.split(".")
        if len(parts) < 3 or parts[0] != "blocks" or not parts[1].isdigit():
            return None
        layers.append(int(parts[1]))
    return min(layers) if layers else None


_START_INSIDE: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def logits_bytes(k: int, vocab: int) -> int:
    """Working memory of one prompt's logits at its k scored positions and the float64 temporaries
    of its metric: 3 x 4 x k x vocab bytes (what sizes every intervention's chunks of prompts)."""
    return 12 * k * vocab


def can_start_inside(bridge: Bridge, cache: Cache, layer: int, positions: Any) -> bool:
    """Whether blocks can run from `cache`'s residual at `layer` (`run_from`): the residual is
    cached.  Checked once per model: run_from with no hooks must reproduce the cached logits of
    the first prompts at the scored `positions` (`logits_at`; else every run is a whole forward)."""
    if hook_resid_pre(layer) not in cache:
        return False
    known = _START_INSIDE.get(bridge)
    if known is None and "logits_at" not in cache:
        return False
    if known is None:
        m = 2
        want = cache["logits_at"][:m]
        got = run_from(bridge, layer, cache[hook_resid_pre(layer)][:m], Plan(), positions[:m])
        known = float((got.double() - want.double()).abs().max()) <= 1e-4 * (1.0 + float(want.abs().max()))
        _START_INSIDE[bridge] = known
    return known


def run_from(bridge: Bridge, layer: int, resid: Float[Tensor, "n pos d_model"], plan: Plan,
             positions: Int[Tensor, "n k"]) -> Float[Tensor, "n k vocab"]:
    """Blocks `layer`.. of the model from `resid` (that run's blocks.{layer}.hook_resid_pre),
    with the plan's hooks (all on blocks >= layer), then ln_final and the unembedding at the
    scored `positions` only: the logits there [n, k, vocab].  Layers below `layer` are not
    recomputed: an intervention that starts at `layer` cannot change them.  A rotary model's
    blocks are given each layer's rotation (mech.block.rotary) and causal (sliding-window)
    mask (mech.block.arith), as the model's own forward gives them."""
    import torch

    start = first_layer(plan)
    if start is not None and start < layer:
        raise ValueError(f"a hook of the plan sits below layer {layer}")
    arch = architecture.of(bridge)
    hooks, fired = _counted(bridge, plan)
    x = resid
    s = x.shape[1]
    tables = rotary.tables(bridge, s, x.dtype, x.device)
    masks: dict[int | None, Any] = {}
    with torch.no_grad(), bridge.hooks(fwd_hooks=hooks):
        for i, block in enumerate(list(bridge.blocks)[layer:], start=layer):
            table = tables[i]
            if table is not None:
                window = arch.windows[i]
                if window not in masks:
                    masks[window] = causal(s, window, x)[None, None]
                out = block(x, attention_mask=masks[window], position_embeddings=table,
                            position_ids=torch.arange(s, device=x.device)[None])
            else:
                out = block(x)
            x = out[0] if isinstance(out, tuple) else out
        idx = positions.to(x.device).unsqueeze(-1).expand(-1, -1, x.shape[-1])
        logits = output_transform(bridge, bridge.unembed(bridge.ln_final(x.gather(1, idx))))
    _check_fired(plan, fired)
    cost.spend(resid.shape[0], cost.layers_from(layer, int(bridge.cfg.n_layers)))
    return cast("Tensor", logits)


def for_architecture(bridge: Bridge, wanted: list[str]) -> list[str]:
    """The hooks to cache for `wanted` on this model's architecture: without learned positions
    there is no hook_pos_embed (embed is the token embedding alone); with parallel blocks no
    resid_mid (an MLP reads resid_pre, which is cached instead); a layer with a norm after its
    attention adds its pre-norm attention sum wherever its z is cached (mech.edges.writes)."""
    arch = architecture.of(bridge)
    out: list[str] = []
    for name in dict.fromkeys(wanted):
        L = hook_layer(name)
        if name == HOOK_POS_EMBED and arch.positions != "learned":
            continue
        if L is not None and not arch.has_mlp and name == hook_mlp_out(L):
            continue
        if L is not None and arch.parallel and name == hook_resid_mid(L):
            out.append(hook_resid_pre(L))
            continue
        out.append(name)
        if L is not None and arch.post_norms and name == hook_z(L):
            out.append(hook_attn_sum(L))
    return list(dict.fromkeys(out))


def cache_hooks(bridge: Bridge, tokens: Int[Tensor, "n pos"], names: list[str], positions: Any = None,
                budget_bytes: int | None = None, check: Callable[[dict[str, float]], None] | None = None,
                keep: int | None = None, each: Callable[[Any, int], None] | None = None) -> Cache:
    """A clean forward caching the named hooks; returns {name: tensor} and the logits, on the
    model's device (the tokens are moved there).  The prompts run in batches whose logits fit
    `budget_bytes`, and the batches' activations are concatenated.  Without `positions` the
    whole logits are kept under "logits" [n, pos, vocab]; with `positions` [n, k] only those at
    the scored positions, under "logits_at" [n, k, vocab] (what the metric reads).  The
    batches' working memory is `budget_bytes` (default: harness.memory.working of 256 MiB): a
    prompt's float32 logits where the model unembeds, with the float64 temporaries of the metric
    at its k scored positions (logits_bytes, as an intervention's chunks count them).
    `check({hook: bytes a prompt})` is called after the first batch with what each prompt's cached
    activations hold, hook by hook (harness.memory.check_cache stops a run whose caches cannot fit).
    `each(logits, lo)`: called with each batch's logits (at the scored positions) and the index of
    its first prompt, so what is read of them (the metric) is taken batch by batch; `keep`: the
    logits of the first `keep` prompts only are kept (0: none; None: all), so they do not grow
    with n."""
    import torch

    budget_bytes = memory.working(256 * 2**20) if budget_bytes is None else budget_bytes
    names = for_architecture(bridge, names)
    n, s = tokens.shape
    # the unembedding only from the first scored position on (the model's `logits_to_keep`), where
    # the model takes it: nothing before it is read, and the batches are sized by what is unembedded
    first = 0 if positions is None else int(positions.min())
    unembedded = s - first if logits_from(bridge, s, first) else s
    # its float32 logits, and at the k scored positions the float64 temporaries of the metric read from them
    k, vocab = (0 if positions is None else int(positions.shape[1])), vocab_out(bridge.cfg)
    per_prompt = max(1, max(0, unembedded - k) * vocab * 4 + logits_bytes(k, vocab))
    size = max(1, budget_bytes // per_prompt)
    parts: dict[str, list[Any]] = {name: [] for name in names}
    whole: dict[str, Any] = {}  # hooks whose first axis is the batch: one tensor [n, ...] filled batch by batch
    logits_parts = []
    for lo in progress(range(0, n, size), f"caching {n} prompts in batches of {size}", quiet=True):
        unembed = {} if positions is None else logits_from(bridge, s, int(positions[lo:lo + size].min()))
        with torch.no_grad():
            logits, cache = bridge.run_with_cache(tokens[lo:lo + size].to(of(bridge)),  # type: ignore[call-overload]
                                                  names_filter=lambda x: x in names, **unembed)
        missing = [x for x in names if x not in cache]
        if missing:
            raise SanityCheckError(f"hook(s) never fired while caching: {', '.join(missing)}")
        cost.spend(min(n, lo + size) - lo)
        if check is not None and lo == 0:
            rows = min(n, size)
            check({x: cache[x].numel() * cache[x].element_size() / rows for x in names if cache[x].shape[0] == rows})
        for name in names:
            got, rows = cache[name], min(n, lo + size) - lo
            if lo == 0 and got.shape[0] == rows and n > rows:  # filled in place: no list and no concatenation
                whole[name] = got.new_empty((n, *got.shape[1:]))  # of all n, which would hold the cache twice
            if name in whole and (got.shape[0] != rows or got.shape[1:] != whole[name].shape[1:]):
                parts[name].append(whole.pop(name)[:lo])  # a batch of another shape: concatenated after all
            if name in whole:
                whole[name][lo:lo + rows] = got
            else:
                parts[name].append(got)
        if positions is not None:
            # the kept positions' index: the logits start at position s - logits.shape[1]
            logits = metrics.at_positions(logits, positions[lo:lo + size] - (s - logits.shape[1]))
        if each is not None:
            each(logits, lo)
        kept = max(0, min(logits.shape[0], (n if keep is None else keep) - lo))
        if kept:
            logits_parts.append(logits if kept == logits.shape[0] else logits[:kept].clone())
        del logits, cache
    out = {name: whole[name] if name in whole else
           torch.cat(parts[name]) if len(parts[name]) > 1 else parts[name][0] for name in names}
    if logits_parts:
        out["logits" if positions is None else "logits_at"] = (torch.cat(logits_parts) if len(logits_parts) > 1
                                                               else logits_parts[0])
    return out


def logits_from(bridge: Bridge, s: int, first: int) -> dict[str, int]:
    """The keyword that has the model's forward unembed only positions first..s-1 of s
    ({"logits_to_keep": s - first}, the last s - first positions), when its forward takes it
    (the Hugging Face causal LMs); {} otherwise, or when every position is wanted."""
    import inspect

    model = getattr(bridge, "original_model", None)
    forward = getattr(model, "forward", None)
    if first <= 0 or forward is None:
        return {}
    try:
        takes = "logits_to_keep" in inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return {}
    return {"logits_to_keep": s - first} if takes else {}


def ablation_plan(heads: list[Head], kind: str, corrupted_z: dict[int, Float[Tensor, "n pos head d_head"]],
                  mean_z: dict[int, Float[Tensor, "m pos head d_head"]]) -> Plan:
    """Plan that ablates `heads` jointly.

    corrupted_z: {layer: z [n, seq, n_heads, d_head]} of the paired corrupted run (resample);
    mean_z: {layer: z [1 or n, seq, n_heads, d_head]}, the per-position means that replace
    them (mean; mech.runs.reference.Reference takes them over prompts other than the ablated ones).
    """
    if kind not in ABLATIONS:
        raise ValueError(f"unknown ablation {kind!r}; allowed: {', '.join(ABLATIONS)}")
    plan = Plan()
    by_layer: dict[int, list[int]] = {}
    for h in heads:
        by_layer.setdefault(h.layer, []).append(h.head)
    for layer, idx in sorted(by_layer.items()):
        if kind == Ablation.ZERO:
            source = None
        elif kind == Ablation.MEAN:
            source = mean_z[layer]
        else:
            source = corrupted_z[layer]

        def fn(z: Any, hook: Any, idx: Any = idx, source: Any = source) -> Any:
            z = z.clone()
            if source is None:
                z[:, :, idx, :] = 0.0
            else:
                z[:, :, idx, :] = source[:, :, idx, :].to(z.dtype).expand(z.shape[0], -1, -1, -1)
            return z

        plan.add(hook_z(layer), fn)
    return plan


def mlp_ablation_plan(mlps: list[Mlp], kind: str, corrupted_out: dict[int, Float[Tensor, "n pos d_model"]],
                      mean_out: dict[int, Float[Tensor, "m pos d_model"]]) -> Plan:
    """Plan that ablates MLPs jointly at `blocks.L.hook_mlp_out` (the MLP's whole output,
    its bias included): zero -> 0; mean -> `mean_out[layer]` (per position, over reference
    prompts); resample -> `corrupted_out[layer]` (the paired corrupted prompt's output)."""
    if kind not in ABLATIONS:
        raise ValueError(f"unknown ablation {kind!r}; allowed: {', '.join(ABLATIONS)}")
    plan = Plan()
    for m in sorted(set(mlps)):
        source = None if kind == Ablation.ZERO else (mean_out if kind == Ablation.MEAN else corrupted_out)[m.layer]

        def fn(out: Any, hook: Any, source: Any = source) -> Any:
            if source is None:
                return out * 0.0
            return source.to(out.dtype).to(out.device).expand(out.shape[0], -1, -1).clone()

        plan.add(hook_mlp_out(m.layer), fn)
    return plan
