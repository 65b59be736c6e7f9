"""Named random streams.  Every random draw of a run derives its own seed from
the run's seed and a stream, so adding or removing a claim never moves another
claim's numbers, and the same inputs and seed give the same numbers.

    seed of a draw = derive_seed(run seed, stream, *keys)

`derive_seed` hashes the keys with numpy's SeedSequence.  The streams, with the
keys each uses (the numbers are part of the reproducibility contract: changing
one changes published numbers):
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np


class Stream(IntEnum):
    #: baseline clean/corrupted/gap CIs use the run seed itself (no stream)
    CLAIM = 2  #: bootstrap and permutations of claim i (file order); key: i
    SIGNATURE_EFFECT = 7  #: bootstrap of the signature plot's edge effects; no key
    SCAN_EFFECT = 8  #: `harness scan`: bootstrap of edge i's effect; key: i
    SCAN_PERMUTATION = 9  #: `harness scan`: sign-flip test of edge i; key: i
    #: the rotation null shared by every composition pair of a run, `harness weights` and
    #: `harness scan` (mech.weights.null); keys: block size r (d_head), null_dim, chunk index
    #: (1000 draws per chunk).  Streams 1, 4, 5, 6 and 10 (one null per pair) are retired.
    ROTATION_NULL = 11
    #: `explain` (mech.weights.explain): the rotation null of a route's spectrum statistics (the blocks F
    #: themselves, drawn as ROTATION_NULL's); keys: block size r (d_head), null_dim, chunk index
    EXPLAIN_NULL = 12
    DISCOVER = 13  #: `harness discover`: the split into discovery and confirmation prompts; no key
    DISCOVER_EFFECT = 14  #: `harness discover`: bootstrap of the confirmation of the edge ranked r; key: r
    DISCOVER_PERMUTATION = 15  #: `harness discover`: sign-flip test of the edge ranked r; key: r
    #: `harness discover`: the faithfulness curve's intervals; keys: the curve point's index (then CPR, CMD,
    #: the known circuit and the top-|known| circuit)
    DISCOVER_CURVE = 16
    DISCOVER_AGREEMENT = 17  #: `harness discover`: the estimate-vs-exact correlations' intervals; no key
    DISCOVER_STABILITY = 18  #: `harness discover`: the bootstrap resamples of the discovery prompts; no key


def derive_seed(*keys: int) -> int:
    """An independent seed for each tuple of keys (numpy SeedSequence; negative keys
    map to odd numbers, so -1 and 1 differ)."""
    entropy = [2 * int(k) if int(k) >= 0 else -2 * int(k) - 1 for k in keys]
    return int(np.random.SeedSequence(entropy).generate_state(1)[0])
