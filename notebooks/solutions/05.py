"""Solutions to notebook 5's exercise (``# %% exercise NAME`` cells).

``python notebooks/_build.py --solved DIR`` puts them into the notebook; try the
exercise first.
"""

# %% exercise 5
# After step 1, A holds 2 pages, B 1, C 2: one is free. B's token at position 4 (step 3)
# takes it. A's at position 8 (step 4) finds none, and the scheduler preempts the newest
# running request, which is not A.
victim = "C"
at_step = 4

# %% exercise 5b
# The step writes its input token (position 14) and the 2 accepted drafts (15, 16): 17
# tokens; the model's own next token is sampled, not written. Position 16 is in L4, so
# ceil(17 / 4) = 5 pages stay (L0..L4). The drafts had reached position 21, page L5
# (positions 20 and 21): it held only rejected drafts and goes back.
written_after = 17
freed = [5]

# %% exercise 5c
def schedule_decodes(running, held, need, available):
    """-> (scheduled, preempted): lists of request names."""
    running, scheduled, preempted = list(running), [], []
    i = 0
    while i < len(running):
        r = running[i]
        while need[r] > available:           # no page: preempt the newest, maybe r
            victim = running.pop()
            preempted.append(victim)
            available += held[victim]
            if victim == r:
                return scheduled, preempted  # it preempted itself: the step ends
        available -= need[r]
        scheduled.append(r)
        i += 1
    return scheduled, preempted

# %% exercise 5d
def accept_probability(p, q, d):
    """p, q: [V] target and draft distributions; d: the draft -> P(keep d), a float."""
    return min(1.0, p[d] / q[d])                 # q[d] > 0: d was drawn from q


def residual(p, q):
    """p, q: [V] -> [V], the distribution to draw from when the draft is rejected."""
    r = np.maximum(p - q, 0.0)                   # what the acceptance test took away
    return r / r.sum()
