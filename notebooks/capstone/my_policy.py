"""Your cache policy for the capstone (notebooks/capstone/README.md).

Write ``priority``: the evictable entry with the smallest key is evicted first.
An entry has three stamps from its index's one logical clock:

- ``last_access_time``: the last time it was released, matched or marked used;
- ``hit_count``: prefix hits that reused it since its contents were made;
- ``creation_time``: when its contents entered the cache.

Keep it a pure function of those stamps (the index's heap recomputes it to
tell a live entry from a stale one). Then run::

    python notebooks/capstone/check.py notebooks/capstone/my_policy.py
"""

import paged_np as pnp


class MyPolicy(pnp.EvictionPolicy):
    name = "mine"

    def priority(self, entry):
        raise NotImplementedError        # your policy here
