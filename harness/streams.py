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
    COMPOSITION_CLAIMS = 1  #: rotation nulls of a file's composition claims; key: position among them
    CLAIM = 2  #: bootstrap and permutations of claim i (file order); key: i
    WEIGHTS_VS_USE = 4  #: rotation nulls of the weights-vs-use table; key: position among its edges
    COMPOSITION_FIGURE = 5  #: per-cell nulls of the composition figure; keys: mode index, sender, receiver
    SIGNATURE_NULL = 6  #: rotation nulls of the signature plot's candidates; key: candidate index
    SIGNATURE_EFFECT = 7  #: bootstrap of the signature plot's edge effects; no key
    SCAN_EFFECT = 8  #: `harness scan`: bootstrap of edge i's effect; key: i
    SCAN_PERMUTATION = 9  #: `harness scan`: sign-flip test of edge i; key: i
    SCAN_NULL = 10  #: `harness scan`: rotation null of edge i; key: i
    #: `harness weights`: the stream is the mode's index in (q, k, v), i.e. 0, 1, 2; key: pair index
    #: a rotation null extended for BH resolution draws the extra samples from derive_seed(its seed, 1)


WEIGHTS_TABLE_MODE_STREAMS = {"q": 0, "k": 1, "v": 2}
NULL_EXTENSION = 1


def derive_seed(*keys: int) -> int:
    """An independent seed for each tuple of keys (numpy SeedSequence; negative keys
    map to odd numbers, so -1 and 1 differ)."""
    entropy = [2 * int(k) if int(k) >= 0 else -2 * int(k) - 1 for k in keys]
    return int(np.random.SeedSequence(entropy).generate_state(1)[0])
