"""How big the proofs run: a fast default for `make test`, full size with EFFECTGATE_PROOFS=long.

The fast default still kills after every statement of the money path and races every worker;
the long run adds the random repeats and the larger batches (`EFFECTGATE_PROOFS=long make test`,
or `make proofs` for the proofs alone).
"""

from __future__ import annotations

import os

LONG = os.environ.get("EFFECTGATE_PROOFS", "").strip().lower() == "long"


def size(fast: int, long: int) -> int:
    """`long` under EFFECTGATE_PROOFS=long, else `fast`."""
    return long if LONG else fast
