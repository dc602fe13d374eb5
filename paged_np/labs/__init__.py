"""Labs: the learner builds the engine, one seam at a time, and the real engine runs it.

A lab is a file the learner edits (``labs/01_slots.py`` ... ``labs/08_step.py``,
shipped as stubs that raise ``NotImplementedError``) defining the one to three
functions of one seam (``docs/design.md``, "Seams"). ``python -m paged_np lab
NAME --solution PATH`` swaps them into the real engine and serves a toy workload
and SmolLM2 chats through them; it accepts them (exit 0) only when every token
equals the package's own run, the cache's invariants held after every step and
no page leaked. Otherwise it names the function, the first failing case and
everything that differed (``docs/labs.md``).

In course order (:data:`LABS`): slots on a free list, paged attention in one
pass, the longest cached prefix, copy-on-write, an eviction priority, the
scheduling decision, the sampler, the engine step. ``lab all --solution DIR``
runs SmolLM2 on nothing but the learner's pieces.

Python use (a notebook, a test)::

    from paged_np.labs import run
    result = run("slots", "labs/01_slots.py", smollm2=None)   # the toy workload only
    print(result.message); result.ok
"""

from .runner import LABS, Result, run

__all__ = ["LABS", "Result", "run"]
