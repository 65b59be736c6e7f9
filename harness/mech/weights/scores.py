"""Weight evidence: composition scores (Elhage et al. 2021) against a
spectrum-preserving rotation null, and OV copying scores.

Row-vector convention (TransformerLens): per head
    OV = W_V W_O            (d_model x d_model, rank <= d_head)
    QK = W_Q W_K^T          (query side x key side)

Composition of sender head A (earlier layer) into receiver head B:
    C = ||X Y||_F / (||X||_F ||Y||_F),  X = OV_A,
    Y = QK_B (q),  QK_B^T (k),  OV_B (v).

Rotary positions: the query at position i meets the key at j through
W_Q R(j - i) W_K^T, so the QK form, and C with it, depends on the offset.  What
does not is which residual directions the queries (keys) read and how strongly:
R is orthogonal, so ||X W_Q R|| = ||X W_Q||.  Q- and K-composition of a rotary
model are therefore one-sided and offset-free,
    Y = W_Q,B (q),  W_K,B (k)           (d_model x d_head),
with the same rotation null (it keeps both spectra); V-composition is untouched by
the rotation (Y = OV_B).  Whether the other side of the QK form then matches is
position-dependent and left to the causal tests.  Grouped-query attention: the
receiver's W_K, W_V (and a sender's W_V) are its key/value head's.

Weight processing (`processing`):
* "raw":    the weights as stored (what `all_composition_scores` uses on an
            unprocessed bridge);
* "folded": LayerNorm folded in, as TransformerLens's `process_weights`
            (fold_ln + center_writing_weights) does: readers become
            P diag(w_ln1) W_{Q,K,V} and writers W_O P, with P = I - 11^T/d the
            centring projection (LN removes the mean of its input anyway).
            RMSNorm weights are folded without centring (RMSNorm keeps the
            mean); Gemma's RMSNorm multiplies by (1 + w), which is what is
            folded; a norm after the attention (Gemma 2 and 3, OLMo 2) scales
            each head's write, so W_O becomes W_O diag(w_post); a QK-norm
            (Qwen3, Gemma 3, OLMo 2) scales each head's query and key by its
            gain, so W_Q and W_K become W_Q diag(g_q) and W_K diag(g_k) (the
            head's slice of the gain where the norm spans the projection);
            models without norm weights are left as they are.

QK-norm: q_h = g_q * p_h / rms(p_h) (p_h = x W_Q[h]: the head's projection; the RMS over the
head's values, or over every head's where the norm spans the projection).  The division is one
positive number per token (and head): it changes how large a query is, never its direction, so
it is left out, and the score (a ratio of norms, unchanged when Y is scaled) is a statement
about which residual directions the head's queries and keys read, with the gain's weighting.
How much of a route's signal survives the per-token normalisation is left to the causal tests.

The scores, their rotation null and the context numbers are computed in
factored form by mech.weights.factored (and mech.weights.null); this module holds the
weights they start from and the record they produce.

Monte Carlo resolution: the smallest attainable p is 1/(1 + n_draws), so with
n tests corrected by Benjamini-Hochberg nothing can be significant at alpha
unless n_draws + 1 > n / alpha.  `draws_needed` gives the count that makes the
floor alpha/2; pairs whose p is below alpha after the base draws are extended to
it (pairs at or above alpha cannot become significant), and the count used is
recorded per pair.

A route stands out (`stands_out`) when its score is at least `min_ratio` times the median
of its peers' scores, the peers being every other earlier head's route into the same
receiver input (mech.weights.factored.peers):

    peer_ratio = C / median(C_peers) >= min_ratio

A trained model's residual stream is not isotropic, so about half of all its pairs beat the
rotation null by a hair; the peer ratio asks whether this sender is aligned with the input
more than the other heads that write into the stream it reads.  A route "composes" when it
beats the null (BH-adjusted p < alpha) and stands out (`composes`); a route with fewer than
MIN_PEERS peers (a median of one or two scores is no reference) is judged by the null alone.

Also reported: C * sqrt(null_dim) (1 = the isotropic baseline E[C^2] = 1/null_dim),
C / C_max with C_max = min(s1(X)/||X||_F, s1(Y)/||Y||_F) (the largest score
the two spectra allow), and the pair's percentile among all cross-layer pairs.

Copying score of head h: eigenvalues lambda of the full OV circuit
W_E OV_h W_U (vocab x vocab); its non-zero eigenvalues are those of the
d_head x d_head matrix W_O W_U W_E W_V, so that is what is decomposed.
    copying = Re(sum lambda) / sum |lambda|   (1 = pure copying)
undefined (None) when sum |lambda| is ~0 (the head's OV circuit never reaches
the unembedding).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ...evidence.details import Num, Record, optional
from ...model import architecture
from ...model.bridge import Bridge
from ...model.shape import vocab_out
from ...spec.vocabulary import MODES
from ...spec.vocabulary import WEIGHT_PROCESSING as PROCESSING
from ...threads import single_threaded

__all__ = ["MODES", "PROCESSING", "HeadWeights", "head_weights", "copying_score", "CopyingScore",
           "CompositionResult", "draws_needed"]


VOCAB_CHUNK = 1024  # tokens per block when the vocabulary is read in blocks (HeadWeights.vocab_products)


@dataclass
class HeadWeights:
    """Per-layer stacks in float64 on the CPU, whatever the model's device (MPS has
    no float64, and the null draws use CPU generators): W_Q, W_K, W_V [L, H, d, dh];
    W_O [L, H, dh, d].  The vocabulary matrices W_E [vocab, d] and W_U [d, vocab] are read
    only when asked for, in blocks of VOCAB_CHUNK tokens, never more than a block at a time:
    their product W_U W_E by `unembed_embed` (copying scores), and `vocab_products`
    (mech.weights.explain's token readouts).
    W_pos [n_ctx, d] is None for a model without learned absolute positions.  Under grouped-query
    attention W_K and W_V are each query head's key/value head's (repeated over its group; a
    read-only view where a layer has one key/value head), so every stack is per query head.
    `rotary`: the model rotates q and k by position (Q- and K-composition are one-sided,
    mech.weights.factored)."""

    W_Q: Any
    W_K: Any
    W_V: Any
    W_O: Any
    vocab: Callable[[int, int], tuple[Any, Any]]  # (a, b) -> (W_E[a:b], W_U[:, a:b]), processed as the rest
    d_vocab: int  # input vocabulary: the rows of W_E
    positions: Callable[[], Any]  # () -> W_pos or None, processed as the rest
    processing: str
    null_dim: int  # dimension the null rotates in: d_model, or d_model - 1 after centring
    d_vocab_out: int = -1  # output vocabulary: the columns of W_U (-1: d_vocab)
    rotary: bool = False
    _embedding: tuple[Any, float, float] | None = None  # unembed_embed, once computed
    _positions: list[Any] = field(default_factory=list)  # [W_pos] once read

    @property
    def vocab_span(self) -> int:
        """Token ids either matrix has: max(d_vocab, d_vocab_out); W_E[a:b] and W_U[:, a:b]
        simply end where their vocabulary does."""
        return max(self.d_vocab, self.d_vocab_out)

    @property
    def shared_vocab(self) -> int:
        """Token ids both vocabularies have, 0..min(d_vocab, d_vocab_out) - 1: where a head
        can copy a token to itself (copying_score)."""
        return min(self.d_vocab, self.d_vocab_out if self.d_vocab_out > 0 else self.d_vocab)

    def unembed_embed(self) -> tuple[Any, float, float]:
        """(W_U[:, :n] W_E[:n] [d, d], ||W_E[:n]||, ||W_U[:, :n]||) over the shared vocabulary n, summed
        block by block (VOCAB_CHUNK tokens): the vocabulary enters a copying score only through this
        product, and a 262k-token vocabulary would make W_E and W_U 1.3 GB each in float64."""
        if self._embedding is None:
            n = self.shared_vocab
            gram, e2, u2 = None, 0.0, 0.0
            for a in range(0, n, VOCAB_CHUNK):
                W_E, W_U = self.vocab(a, min(n, a + VOCAB_CHUNK))
                part = W_U @ W_E
                gram = part if gram is None else gram + part
                e2, u2 = e2 + float(W_E.square().sum()), u2 + float(W_U.square().sum())
            self._embedding = (gram, e2 ** 0.5, u2 ** 0.5)
        return self._embedding

    @property
    def W_pos(self) -> Any | None:
        if not self._positions:
            self._positions.append(self.positions())
        return self._positions[0]

    def vocab_products(self, left: Any, right: Any | None = None,
                       chunk: int | None = None) -> Iterator[tuple[Any, Any, Any]]:
        """Block by block of `chunk` (VOCAB_CHUNK) tokens, in token order: (W_E[a:b] left [b - a, k], the row
        norms ||W_E[t]|| [b - a], right^T W_U[:, a:b] [m, b - a] or None): one pass over the vocabulary,
        never more than a block of it held."""
        import torch

        size = chunk or VOCAB_CHUNK
        for a in range(0, self.vocab_span, size):
            E, U = self.vocab(a, min(a + size, self.vocab_span))
            with single_threaded():
                yield E @ left, torch.linalg.norm(E, dim=-1), (right.mT @ U if right is not None else None)

    @property
    def d_model(self) -> int:
        return int(self.W_Q.shape[-2])

    @property
    def n_layers(self) -> int:
        return int(self.W_Q.shape[0])

    @property
    def n_heads(self) -> int:
        return int(self.W_Q.shape[1])


def head_weights(bridge: Bridge, processing: str = "folded") -> HeadWeights:
    """Read the attention weights from a bridge (never modifying it), as CPU float64 copies."""
    import torch

    if processing not in PROCESSING:
        raise ValueError(f"unknown weight processing {processing!r}; allowed: {', '.join(PROCESSING)}")
    arch = architecture.of(bridge)
    with torch.no_grad():
        def get(name: str) -> Any:
            return getattr(bridge, name).detach().to("cpu", torch.float64, copy=True)

        W_Q, W_K, W_V, W_O = (get(n) for n in ("W_Q", "W_K", "W_V", "W_O"))
        if processing == "folded" and arch.qk_norm:  # the QK-norm's gain scales what each head's q and k read
            for layer in range(W_Q.shape[0]):
                attn = bridge.blocks[layer].attn
                for W, name in ((W_Q, "q_norm"), (W_K, "k_norm")):
                    g = _ln_weight(attn, name)
                    if g is not None:
                        W[layer] = W[layer] * (g if arch.qk_norm == "head" else g.view(W.shape[1], 1, -1))
        null_dim = int(W_Q.shape[-2])
        folded = processing == "folded"
        centre = folded and arch.norm == "LN"
        if folded:
            for layer in range(W_Q.shape[0]):
                w = _ln_weight(bridge.blocks[layer], "ln1")
                post = _ln_weight(bridge.blocks[layer], "ln1_post")
                if post is not None:  # the norm after the attention scales every head's write
                    W_O[layer] = W_O[layer] * post
                if w is None and not centre:
                    continue
                W_Q[layer], W_K[layer], W_V[layer] = (_read(W[layer], w, centre) for W in (W_Q, W_K, W_V))
            if centre:  # W P = W minus each row's mean
                W_O = W_O - W_O.mean(-1, keepdim=True)
                null_dim -= 1
        if arch.grouped:  # each query head reads its key/value head's keys and values
            W_K, W_V = _per_query_head(W_K, arch.n_heads), _per_query_head(W_V, arch.n_heads)

    wf = _ln_weight(bridge, "ln_final") if folded else None

    def vocab(a: int, b: int) -> tuple[Any, Any]:
        with torch.no_grad():
            W_E = bridge.W_E[a:b].detach().to("cpu", torch.float64, copy=True)
            W_U = bridge.W_U[:, a:b].detach().to("cpu", torch.float64, copy=True)
            if centre:  # writing weights: W P
                W_E = W_E - W_E.mean(-1, keepdim=True)
            if wf is not None or centre:
                W_U = _read(W_U, wf, centre)
            return W_E, W_U

    def positions() -> Any:
        W_pos = _positions(bridge)
        if W_pos is not None and centre:  # TransformerLens centres W_pos as well
            W_pos = W_pos - W_pos.mean(-1, keepdim=True)
        return W_pos

    return HeadWeights(W_Q, W_K, W_V, W_O, vocab, int(bridge.cfg.d_vocab), positions, processing, null_dim,
                       vocab_out(bridge.cfg), arch.rotary)


def _per_query_head(W: Any, n_heads: int) -> Any:
    """A key/value head's W [L, n_kv, d, r] repeated for each query head of its group: [L, n_heads, d, r].
    With one key/value head a layer the repeat is a view (no copy: 0.14 GiB of float64 for Gemma 3
    270M's keys and values); read-only either way."""
    if W.shape[1] == 1:
        return W.expand(W.shape[0], n_heads, *W.shape[2:])
    return W.repeat_interleave(n_heads // W.shape[1], dim=1)


def _positions(bridge: Bridge) -> Any | None:
    """W_pos [n_ctx, d] as a CPU float64 copy; None unless the model adds learned absolute
    positions to the residual stream (`positional_embedding_type: standard`)."""
    import torch

    if str(getattr(bridge.cfg, "positional_embedding_type", "standard")) != "standard":
        return None
    try:
        W = bridge.W_pos
    except (AttributeError, KeyError, NotImplementedError):
        return None
    return W.detach().to("cpu", torch.float64, copy=True) if isinstance(W, torch.Tensor) else None


def _read(W: Any, w: Any | None, centre: bool) -> Any:
    """P diag(w) W for a reading matrix W [..., d, k] (P = I - 11^T/d when `centre`, else I),
    computed as a scaling and a mean subtraction over the d axis."""
    out = W if w is None else w[:, None] * W
    return out - out.mean(-2, keepdim=True) if centre else out


def _ln_weight(module: Any, name: str) -> Any | None:
    """The scale a norm multiplies by (float64, CPU): its weight w, or 1 + w for norms that
    store the offset from 1 (Gemma's RMSNorm); None for a norm without a weight."""
    import torch

    ln = getattr(module, name, None)
    w = getattr(ln, "weight", None) if ln is not None else None
    if not isinstance(w, torch.Tensor):
        return None
    w = w.detach().cpu().to(torch.float64)
    return 1.0 + w if getattr(ln, "uses_weight_offset", False) else w


class CompositionResult(Record):
    """Score, null and context numbers of one sender -> receiver.{q,k,v} pair (a record
    of the evidence: a composition claim's details extend it)."""

    sender: str
    receiver: str  # e.g. "L1H5.k"
    mode: str
    score: Num  # C; NaN (null in JSON) when a matrix is zero: no route
    p_value: float
    null_mean: float
    null_std: float
    null_q95: float
    null_q99: float
    n_draws: int
    ratio_to_isotropic: Num  # C * sqrt(null_dim)
    fraction_of_max: Num  # C / C_max
    c_max: float
    percentile: Num  # among all cross-layer pairs of this mode, in [0, 100]
    rank_sender: int
    rank_receiver: int
    processing: str
    null_dim: int
    peer_median: Num = optional()  # the median score of the route's peers (absent in older documents)
    peer_ratio: Num = optional()  # C / peer_median
    peer_rank: int | None = optional()  # 1 + the peers scoring above C
    n_peers: int | None = optional()


MIN_PEERS = 5  # fewer peers than this: no peer test (the rotation null alone decides)


def stands_out(peer_ratio: float | None, min_ratio: float) -> bool:
    """C >= min_ratio x the median of its peers' scores (module docstring); None: fewer than
    MIN_PEERS peers (True)."""
    return peer_ratio is None or peer_ratio >= min_ratio


def composes(p_adjusted: float, peer_ratio: float | None, alpha: float, min_ratio: float) -> bool:
    """The one rule of "composes": the rotation null rejected (p_adjusted < alpha; a route with no
    score has p = 1) and the route stands out among its peers."""
    return p_adjusted < alpha and stands_out(peer_ratio, min_ratio)


def draws_needed(n_tests: int, alpha: float) -> int:
    """Null draws that bring the BH floor n_tests / (1 + draws) down to alpha / 2."""
    return max(0, math.ceil(2 * n_tests / alpha) - 1)


@dataclass(frozen=True)
class CopyingScore:
    value: float | None  # None: undefined (the OV circuit never reaches the unembedding)
    sum_abs_eigenvalues: float
    n_eigenvalues: int
    processing: str


def copying_score(hw: HeadWeights, layer: int, head: int, tol: float = 1e-12) -> CopyingScore:
    """Re(sum lambda) / sum |lambda| of W_E OV W_U via the d_head x d_head form W_O (W_U W_E) W_V
    (the same non-zero eigenvalues), over the token ids both vocabularies have (W_E[:n],
    W_U[:, :n], n = hw.shared_vocab: all of them unless the output vocabulary differs from the
    input one)."""
    import torch

    gram, norm_E, norm_U = hw.unembed_embed()
    M = (hw.W_O[layer, head] @ gram) @ hw.W_V[layer, head]
    with single_threaded():
        lam = torch.linalg.eigvals(M)
        R_v = torch.linalg.qr(hw.W_V[layer, head], mode="r").R  # ||W_V W_O|| = ||R_v W_O||
    total = float(lam.abs().sum())
    scale = norm_E * norm_U * float(torch.linalg.norm(R_v @ hw.W_O[layer, head]))
    defined = scale > 0.0 and total > tol * scale
    return CopyingScore(float(lam.sum().real) / total if defined else None, total, int(lam.numel()),
                        hw.processing)
