"""Lab 2: paged attention in one pass (the online softmax).

Run it:  python -m paged_np lab attention --solution labs/02_attention.py

A sequence's keys and values do not sit in one array: they are spread over
pages of the arena. Attention must still take a softmax over *all* of a row's
scores, while seeing them one page at a time. The trick (Milakov & Gimelshein
2018; the loop inside FlashAttention and vLLM's PagedAttention) keeps three
running values per row, corrected as each page arrives:

    m    the largest score seen so far                         [R]
    l    the sum of exp(score - m) over the keys seen so far    [R]
    acc  the sum of exp(score - m) * v                         [R, D]

You write the update for one page, and the last step. The lab hands you the
pages one at a time (never the whole sequence: there is nothing to gather),
starting from m = -inf, l = 0, acc = 0 (float32), and serves SmolLM2 with your
attention in every layer.

R rows are the queries of one sequence times the query heads that share one
kv head; q is already multiplied by the softmax scale 1/sqrt(D).
"""

import numpy as np  # noqa: F401  (you will want it)


def attend_page(state, q, k_page, v_page, mask):
    """Fold one page into the running state; return the new ``(m, l, acc)``.

    state: ``(m [R], l [R], acc [R, D])``; q ``[R, D]``; k_page, v_page ``[P, D]``
    (the page's valid rows); mask ``[R, P]`` bool, True where row r may see key j
    (causal; a row may see none of a page's keys, even of its first page).
    Keep the state's shapes: it is three running values, whatever the pages seen.
    """
    raise NotImplementedError        # your code here (about eight lines)


def finish(state):
    """The output of every row: ``(out [R, D], lse [R])`` from ``(m, l, acc)``.

    ``lse`` is the log of the sum of exp(score) over every key the row saw.
    """
    raise NotImplementedError        # your code here (one or two lines)
