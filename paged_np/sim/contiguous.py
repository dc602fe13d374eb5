"""Contiguous KV reservation, the way servers did it before paging (Orca).

Each request gets one contiguous range of token slots at admission and keeps
it until it finishes. How big the range is decides the waste:

- ``orca_max``: the model's maximum length (2048), whatever the request needs;
- ``orca_pow2``: the next power of two of the request's true length;
- ``orca_oracle``: exactly its true length (an oracle knows the output length).

Slots reserved beyond the true length are internal fragmentation; the free
holes between ranges, too small for the next request, are external
fragmentation. :class:`FirstFit` is the allocator: address-ordered holes,
first fit, neighbours merged on free. The paged cache
(:class:`~paged_np.PagedKVCache`) removes both kinds of waste; the
simulation (:mod:`paged_np.sim.simulate`) measures how much.
"""

from __future__ import annotations

import bisect

from ..errors import InvalidArgument

MAX_LEN = 2048  # the OPT models' context: what Orca (Max) reserves
SCHEMES = ("orca_max", "orca_pow2", "orca_oracle")


class FirstFit:
    """Contiguous allocator: address-ordered free holes, first fit, merged on free."""

    def __init__(self, size: int):
        self.size = size
        self.starts = [0]  # hole starts, ascending
        self.lens = [size]  # hole lengths
        self.used = 0

    def allocate(self, n: int) -> int | None:
        """Offset of ``n`` contiguous slots, or None when no hole is big enough."""
        for i, length in enumerate(self.lens):
            if length >= n:
                off = self.starts[i]
                if length == n:
                    del self.starts[i], self.lens[i]
                else:
                    self.starts[i] += n
                    self.lens[i] -= n
                self.used += n
                return off
        return None

    def free(self, off: int, n: int) -> None:
        i = bisect.bisect(self.starts, off)
        self.starts.insert(i, off)
        self.lens.insert(i, n)
        self.used -= n
        # Merge with the right neighbour, then the left one.
        if i + 1 < len(self.starts) and off + self.lens[i] == self.starts[i + 1]:
            self.lens[i] += self.lens.pop(i + 1)
            del self.starts[i + 1]
        if i > 0 and self.starts[i - 1] + self.lens[i - 1] == off:
            self.lens[i - 1] += self.lens.pop(i)
            del self.starts[i]


def reserve_size(total_len: int, scheme: str, max_len: int = MAX_LEN) -> int:
    """Slots Orca reserves for a request whose true length is ``total_len``."""
    if scheme == "orca_max":
        return max_len
    if scheme == "orca_pow2":
        return min(max_len, 1 << (total_len - 1).bit_length())
    if scheme == "orca_oracle":
        return total_len
    raise InvalidArgument(f"scheme must be one of {SCHEMES}, got {scheme!r}")
