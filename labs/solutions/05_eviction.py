"""Lab 5, solved: an eviction priority. Try the lab (labs/05_eviction.py) first."""


def priority(entry):
    """A sortable key for a CACHED page: the smallest key is evicted first."""
    return (entry.hit_count, entry.last_access_time)    # fewest hits, then the oldest use


def choose_victim(entries, ref_count, priority):
    """The page id to evict: of the ``entries`` no block table holds, the smallest priority."""
    idle = [e for e in entries if ref_count(e.page_id) == 0]   # live pages never go
    return min(idle, key=priority).page_id
