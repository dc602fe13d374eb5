"""Lab 6: the scheduling decision (admit, preempt the newest).

Run it:  python -m paged_np lab scheduler --solution labs/06_scheduler.py

Every step, the scheduler gives each running request its next tokens (one, while
it decodes) and the pages they need, then admits waiting requests. Two of its
decisions are yours:

- ``make_room``: a running request ``req`` needs pages that are not there. While
  ``fits()`` says no, preempt the **newest** running request: ``running`` lists
  them oldest first, so that is ``running[-1]``, maybe ``req`` itself. A preempted
  request gives its pages back and waits to be computed again, so the one
  admitted last, having done the least, loses the least. ``preempt(r)`` takes r
  out of ``running`` and frees its pages (do not change ``running`` yourself).
  Return True if ``req`` runs, False if it preempted itself (the step stops there).
- ``admit``: waiting requests join in queue order (first come, first served)
  while they get seats (request ``r`` takes ``r.seats``: 1, or n for a prompt
  with n samples) and ``try_admit(r)`` finds their pages (it admits r and returns
  True, or returns False: stop there, a later request never passes it). In a step
  that had to preempt, admit no one: the newcomer would take the pages back.
  Return the admitted requests, in order.

The lab plugs both into the engine's scheduler, serves SmolLM2 and a toy
workload in a cache too small for everyone, and checks that the same requests
are admitted and preempted at the same steps as in the package's run.
"""


def make_room(running, req, fits, preempt):
    """Preempt newest-first until ``fits()``; True if ``req`` still runs, else False."""
    raise NotImplementedError        # your code here (about five lines)


def admit(waiting, seats, preempted, try_admit):
    """Admit ``waiting`` requests in order while seats allow; returns those admitted."""
    raise NotImplementedError        # your code here (about eight lines)
