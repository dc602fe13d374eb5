"""Lab 3, the longest cached prefix: ``match_prefix(token_ids, page_size, children)``.

The learner walks the cache's pages the way a radix tree is walked: from the
root, take the cached page whose tokens are exactly the prompt's next page,
then its child, and so on, stopping at the first page that does not match
whole. Two rules make it right: **whole pages only** (a page whose tokens only
begin like the prompt's rest holds K/V of other tokens), and **at most
``len(token_ids) - 1`` tokens** (the last prompt token is always computed: it
yields the logits of the first new token).

How it enters the engine: the lab's prefix index (a
:class:`~paged_np.HashIndex` subclass registered in ``PREFIX_INDEXES``) keeps,
beside the hash chain, which cached page follows which (``children``), and
its ``match_prefix`` asks the learner's function. The cache has already cut
the prompt to whole pages below its last token when it asks the index, so the
lab hands the learner that prefix plus one token (-1, never a real id): the
learner's own cut then gives the same pages. Each answer is checked against
the package's walk where it is used.
"""

from __future__ import annotations

from ..cache.hash_index import ROOT_HASH
from .report import LabFailure, expect, show

TITLE = "the longest cached prefix"
FILE = "03_prefix.py"
FUNCTIONS = ("match_prefix",)
BLAME = "match_prefix"

HINTS = {
    "match_prefix": (
        "A cached page is reusable only if every token before its end is the prompt's: "
        "walk from the root, one whole page at a time, and stop at the first miss. A page "
        "that only starts like the prompt's rest holds K/V of other tokens. And never reuse "
        "the prompt's last token: it must be computed to give logits.",
        "pages, parent = [], None; for i in range((len(token_ids) - 1) // page_size): want "
        "= list(token_ids[i * page_size:(i + 1) * page_size]); hit = [p for p, t in "
        "children(parent) if list(t) == want]; stop if there is none; else append hit[0] "
        "and make it the parent."),
}


def children_of(index, extra_key=None):
    """The learner's ``children(page)``: ``[(page_id, tokens), ...]`` following ``page``."""

    def children(page=None):
        parent = ROOT_HASH if page is None else index.page_hash(int(page))
        if parent is None:
            raise LabFailure("match_prefix", f"asked children({page!r}), but page {page} is "
                                             "not cached: pass None or a page children "
                                             "gave you")
        out = []
        for h in sorted(index.lab_kids.get((parent, extra_key), ())):
            p = index.lookup(h)
            out.append((p, list(index.lab_tokens[p])))
        return sorted(out)

    return children


def describe_cache(index, extra_key=None, limit: int = 40) -> str:
    """The cached pages as a tree, one line a page, for a refusal's case."""
    lines, stack = [], [(None, 0)]
    children = children_of(index, extra_key)
    while stack and len(lines) < limit:
        page, depth = stack.pop()
        kids = children(page)
        for p, _ in reversed(kids):
            stack.append((p, depth + 1))
        if page is not None:
            lines.append("  " * depth + f"page {page}: {list(index.lab_tokens[page])}")
    return "\n".join(lines) or "(nothing cached)"


def call_match_prefix(learner, index, token_ids, page_size, extra_key=None) -> list:
    """The learner's pages, checked against the package's walk over the same index."""
    case = (f"token_ids={list(token_ids)}, page_size={page_size}; the cached pages "
            f"(children indented under their parent):\n{describe_cache(index, extra_key)}")
    got = learner.call("match_prefix", list(token_ids), page_size,
                       children_of(index, extra_key), case=case)
    cap = (len(token_ids) - 1) // page_size * page_size
    want = index.package_walk(list(token_ids[:cap]), extra_key)
    try:
        mine = [int(p) for p in got]
    except (TypeError, ValueError):
        raise LabFailure("match_prefix", f"returned {show(got)}: a list of page ids is due",
                         case) from None
    why = ""
    if len(mine) * page_size > len(token_ids) - 1:
        why = (f"{len(mine)} page{'s' * (len(mine) > 1)} hold{'s' * (len(mine) == 1)} "
               f"{len(mine) * page_size} tokens, but at most "
               f"len(token_ids) - 1 = {len(token_ids) - 1} may be reused (whole pages): "
               "the last prompt token is always computed")
    expect("match_prefix", case, mine, want, why=why)
    return mine


class PrefixMixin:
    """The lab's index: the hash chain, plus which page follows which, for ``children``."""

    prefix_learner = None                       # set on the class the lab builds

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lab_kids: dict = {}                # (parent hash, extra key) -> {hashes}
        self.lab_links: dict = {}               # page -> (parent hash, extra key, hash)
        self.lab_tokens: dict = {}              # page -> its tokens

    def insert(self, token_ids, pages, handle, extra_key=None, seq_id=None):
        chain, added = super().insert(token_ids, pages, handle, extra_key, seq_id)
        parents = [handle[-1] if handle else ROOT_HASH] + chain[len(handle):-1]
        ps = self.page_size
        for i, (p, parent, h) in enumerate(zip(pages, parents, chain[len(handle):])):
            self.lab_kids.setdefault((parent, extra_key), set()).add(h)
            if p in added:
                self.lab_links[p] = (parent, extra_key, h)
                self.lab_tokens[p] = tuple(token_ids[i * ps:(i + 1) * ps])
        return chain, added

    def evict(self, num_pages, seq_id=None):
        out = super().evict(num_pages, seq_id)
        for p in out:
            parent, key, h = self.lab_links.pop(p)
            self.lab_tokens.pop(p)
            self.lab_kids[(parent, key)].discard(h)
        return out

    def package_walk(self, token_ids, extra_key=None) -> list:
        """The package's answer, counting nothing (``prefix_length``, then the chain)."""
        n = self.prefix_length(token_ids, extra_key) // self.page_size
        hashes = self.page_hashes(token_ids[:n * self.page_size], extra_key)
        return [self.lookup(h) for h in hashes]

    def match_prefix(self, token_ids, extra_key=None):
        if self.prefix_learner is None:
            return super().match_prefix(token_ids, extra_key)
        mine = call_match_prefix(self.prefix_learner, self, list(token_ids) + [-1], self.page_size,
                                 extra_key)
        pages, hashes = super().match_prefix(token_ids, extra_key)   # counts the hits
        assert pages == mine
        return pages, hashes


def serve_prompt(cache, sid, prompt) -> None:
    """A request through the cache, no model: its prompt computed, then freed."""
    n_hit = cache.add_sequence(sid, prompt)
    rest = prompt[n_hit:]
    cache.allocate_slots(sid, len(rest))
    cache.append_tokens(sid, rest)
    cache.free(sid)


def check(learner, rng) -> None:
    """Random prompts over a cache of shared openings, then the hidden cases."""
    import paged_np as pnp

    from ..cache.hash_index import HashIndex

    ps = 4
    cls = type("CheckIndex", (PrefixMixin, HashIndex), {})
    index = cls(ps)
    opening = [[int(t) for t in rng.integers(0, 40, 12)] for _ in range(3)]
    # Two cached pages whose first tokens agree: a walk that compares a token or two
    # takes the wrong one.
    twins = [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6, 9, 9]]
    cache = pnp.PagedKVCache(pnp.CacheConfig(num_pages=64, page_size=ps, head_dim=4),
                             record_events=False)
    cache.prefix_index = cache.pool.prefix_index = index
    for i in range(10):
        head = opening[int(rng.integers(3))][:int(rng.integers(0, 13))]
        serve_prompt(cache, f"r{i}", head + [int(t) for t in rng.integers(0, 40, 5)])
    for i, t in enumerate(twins):
        serve_prompt(cache, f"t{i}", t + [0])
    cases = []
    for _ in range(30):
        head = opening[int(rng.integers(3))][:int(rng.integers(0, 13))]
        cases.append(head + [int(t) for t in rng.integers(0, 40, int(rng.integers(0, 6)))])
    cases += [
        twins[0],                      # every page cached: only len - 1 tokens reusable
        twins[0] + [11],               # ... one more token: both pages
        twins[1][:4] + [5, 6],         # a partial page that begins like a cached one
        twins[1][:7],                  # ... three of its four tokens
        [1, 2, 3, 4, 5, 6, 7, 9, 0],   # the twins' last token differs
        [7], [],
    ]
    for prompt in cases:
        if prompt:
            call_match_prefix(learner, index, prompt, ps)


def swap(learner):
    from .runner import Swap

    return Swap(index_mixins=[type("LabPrefix", (PrefixMixin,), {"prefix_learner": learner})])
