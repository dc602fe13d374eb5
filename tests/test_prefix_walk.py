"""``PrefixIndex.walk``: the index as a tree of plain records, and the readers that use it.

The server's cache view and the radix drawing read the index through ``walk()``
and the cache through ``block_table`` / ``num_released_pages``; they never ask
which index they hold nor read a tree node, a private field or a request's sequence.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import numpy as np
import pytest

import paged_np as pnp
from paged_np.cache.hash_index import HashIndex
from paged_np.cache.prefix_index import IndexNode
from paged_np.cache.radix import RadixIndex

ROOT = Path(__file__).resolve().parents[1]


def test_radix_walk_is_the_tree_a_known_sequence_of_operations_builds():
    tree = RadixIndex(page_size=2)
    assert tree.walk() == []                                  # a tree with nothing cached
    tree.insert((1, 2, 3, 4), [7, 8])                         # root (id 0) -> node 1
    assert tree.walk() == [IndexNode(1, None, (1, 2, 3, 4), (7, 8), 0)]
    node, added = tree.insert((1, 2, 9, 9), [7, 5])           # splits node 1 after a page
    assert added == [5]
    tree.lock(node)                                           # the new leaf's path is live
    # node 2 is the upper half of the split; node 1 keeps the lower half; 3 is new
    assert tree.walk() == [
        IndexNode(2, None, (1, 2), (7,), 1),
        IndexNode(1, 2, (3, 4), (8,), 0),
        IndexNode(3, 2, (9, 9), (5,), 1),
    ]
    tree.unlock(node)
    assert tree.evict(1) == [8]                               # LRU leaf: node 1, from its end
    assert [(n.id, n.parent, n.pages) for n in tree.walk()] == [(2, None, (7,)), (3, 2, (5,))]
    tree.check_invariants()


def test_radix_walk_is_a_copy_and_agrees_with_the_nodes():
    cache = pnp.PagedKVCache(pnp.CacheConfig(num_pages=16, page_size=2, head_dim=2,
                                             prefix_cache="radix"))
    for sid, toks in (("a", [1, 2, 3, 4, 5]), ("b", [1, 2, 9, 9, 5]), ("c", [6, 6])):
        hit = cache.add_sequence(sid, toks)
        slots = cache.allocate_slots(sid, len(toks) - hit)
        kv = np.zeros((len(slots), 1, 2), np.float32)
        cache.write_kv(0, slots, kv, kv)
        cache.append_tokens(sid, toks[hit:])
    index = cache.prefix_index
    walk = index.walk()
    assert [(n.id, n.tokens, n.pages, n.lock_ref) for n in walk] == [
        (t.id, tuple(t.key), tuple(t.value), t.lock_ref) for t in index.nodes()]
    assert sorted(p for n in walk for p in n.pages) == index.pages()
    seen = set()
    for n in walk:                                            # parents before children
        assert n.parent is None or n.parent in seen
        seen.add(n.id)
    with pytest.raises(dataclasses.FrozenInstanceError):
        walk[0].lock_ref = 5
    assert index.walk() == walk


def test_the_hash_chain_keeps_no_tree_to_walk():
    idx = HashIndex(page_size=2)
    idx.insert([1, 2, 3, 4], [7, 8], [])
    assert idx.pages() == [7, 8] and idx.walk() is None
    cache = pnp.PagedKVCache(pnp.CacheConfig(num_pages=4, head_dim=4))
    assert cache.prefix_index.walk() is None


def test_the_drawing_shows_the_walk():
    from paged_np.viz.radix import draw_radix_tree

    tree = RadixIndex(page_size=2)
    tree.insert((1, 2, 3, 4), [7, 8])
    tree.insert((1, 2, 9, 9), [7, 5])
    labels = [t.get_text() for t in draw_radix_tree(tree).axes[0].texts]
    assert labels == ["root", "[1 2]\npages 7\nlock_ref 0", "[3 4]\npages 8\nlock_ref 0",
                      "[9 9]\npages 5\nlock_ref 0"]
    with pytest.raises(pnp.InvalidArgument, match="radix"):
        draw_radix_tree(HashIndex(page_size=2))


#: What each reader must not touch: tree-node fields and a request's sequence (``req.seq``).
FORBIDDEN = {"seq", "key", "value", "children", "nodes", "node_of"}
READERS = ("paged_np/server/cache_view.py", "paged_np/viz/radix.py")


def _reaching_in(path: Path) -> list[str]:
    """Attribute reads in ``path`` that reach into another object: a private field (not
    ``self``'s), a name of :data:`FORBIDDEN`, the index's kind, or a block table read
    as a field (``cache.block_table(sid)``, the cache's method, is the public way)."""
    tree = ast.parse(path.read_text())
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    bad = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        on = node.value
        mine = isinstance(on, ast.Name) and on.id == "self"
        private = node.attr.startswith("_") and not node.attr.startswith("__") and not mine
        kind = node.attr == "kind" and isinstance(on, ast.Attribute) and (
            on.attr == "prefix_index")
        table = node.attr == "block_table" and id(node) not in called
        if private or kind or table or node.attr in FORBIDDEN:
            bad.append(f"line {node.lineno}: .{node.attr}")
    return sorted(bad)


@pytest.mark.parametrize("reader", READERS)
def test_the_readers_use_public_methods_only(reader, tmp_path):
    assert _reaching_in(ROOT / reader) == []
    probe = tmp_path / "probe.py"                             # the checker sees each kind
    probe.write_text("tree._roots\ncache.prefix_index.kind\nreq.seq.block_table\n"
                     "self._mine\ncache.block_table(1)\nevent.kind\n")
    assert _reaching_in(probe) == ["line 1: ._roots", "line 2: .kind", "line 3: .block_table",
                                   "line 3: .seq"]
