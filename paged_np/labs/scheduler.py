"""Lab 6, the scheduling decision: ``make_room(running, req, fits, preempt)`` and
``admit(waiting, seats, preempted, try_admit)``.

Two decisions of vLLM's scheduler are the learner's:

- **preempt the newest**: a running request needs pages that are not there;
  while they are not, the most recently admitted running request gives its
  pages back (it has the least work to lose), possibly the one asking, which
  then waits and ends the step;
- **admit in order**: waiting requests join, first come first served, while
  seats allow and their pages are there, stopping at the first that does not
  fit (a later one never passes it), and not at all in a step that had to
  preempt (the newcomer would take the pages the preempted one needs back).

How they enter the engine: the lab's scheduler (a
:class:`~paged_np.engine.scheduler.Scheduler` subclass in ``SCHEDULERS``)
asks the learner's ``make_room`` wherever the package's scheduler makes
room, and runs the package's pass over the running requests with admission
switched off (no seat left), then the learner's ``admit``. ``fits``,
``preempt`` and ``try_admit`` are the scheduler's own operations, each
checking the rule as it is called, so a wrong decision is refused at the step
it is made; who was admitted and preempted must match the package's run,
step by step.
"""

from __future__ import annotations

from ..engine.scheduler import Scheduler
from .report import LabFailure

TITLE = "the scheduling decision (admit, preempt newest)"
FILE = "06_scheduler.py"
FUNCTIONS = ("make_room", "admit")
BLAME = "make_room"

HINTS = {
    "make_room": (
        "Preempting loses work: the preempted request's K/V is computed again when it "
        "returns. The request admitted last has done the least, so it goes first, even if "
        "it is the one asking; and only while the pages are really not there.",
        "while not fits(): victim = running[-1]; preempt(victim); if victim is req: "
        "return False.  Then return True."),
    "admit": (
        "First come, first served: the queue's order is the order of admission, and a "
        "request that does not fit blocks the ones behind it. After a preemption, admitting "
        "anyone would take back the pages just freed.",
        "if preempted: return []; admitted = []; for r in waiting: if r.seats > seats or "
        "not try_admit(r): break; seats -= r.seats; admitted.append(r).  return admitted."),
}


def name(req) -> str:
    j = req.sample.index
    return req.parent.request_id + (f"/{j}" if j else "")


def names(reqs) -> str:
    return "[" + ", ".join(name(r) for r in reqs) + "]"


def call_make_room(learner, sched, req, n: int) -> int:
    """Tokens of ``req`` that run now (0 if it preempted itself), by the learner's rule."""
    state = {"n": n, "left": False}
    running0 = list(sched.running)
    case = f"running (oldest first) {names(running0)}; {name(req)} asks for {n} token(s)"

    def fits():
        if req not in sched.running:
            raise LabFailure("make_room", f"called fits() after {name(req)} preempted itself: "
                                          "a request that preempted itself ends the step "
                                          "(return False)", case)
        if sched.cache.can_allocate(req.seq_id, state["n"]):
            return True
        if len(sched.running) == 1:                    # alone: its chunk shrinks instead
            state["n"] = min(state["n"] - 1, sched.tokens_that_fit(req))
            return state["n"] >= 1 and sched.cache.can_allocate(req.seq_id, state["n"])
        return False

    def preempt(r):
        if r not in sched.running:
            raise LabFailure("make_room", f"preempt({name(r)}): it is not running (preempt "
                                          "takes it out of running: do not remove it "
                                          "yourself)", case)
        if req in sched.running and sched.cache.can_allocate(req.seq_id, state["n"]):
            raise LabFailure("make_room", f"preempted {name(r)} although {name(req)}'s pages "
                                          "were there: preempt only while fits() is False",
                             case)
        newest = sched.running[-1]
        if r is not newest:
            raise LabFailure("make_room", [
                f"preempted {name(r)} (running {names(sched.running)}, oldest first)",
                f"the package preempts the newest, {name(newest)}: admitted last, it has "
                "the least work to lose"], case)
        sched.preempt(r)

    ok = learner.call("make_room", sched.running, req, fits, preempt, case=case)
    if req not in sched.running:
        if ok:
            raise LabFailure("make_room", f"returned {ok!r} although {name(req)} preempted "
                                          "itself: it no longer runs (return False)", case)
        return 0
    if not ok or not sched.cache.can_allocate(req.seq_id, state["n"]):
        raise LabFailure("make_room", f"returned {ok!r} with {name(req)} still running and "
                                      f"its pages {'there' if not ok else 'not there'}: "
                                      "return True once fits() is", case)
    return state["n"]


def call_admit(learner, sched, out, budget: int, preempted: bool) -> None:
    """Admission by the learner's ``admit``, through a ``try_admit`` that checks each try."""
    queue = list(sched.waiting)
    seats = sched.max_num_seqs - sum(r.seats for r in sched.running)
    st = {"budget": budget, "tried": 0, "refused": None, "seats": seats}
    case = (f"waiting (queue order) {names(queue)}, {seats} seat(s) left, "
            f"{'a request was' if preempted else 'nobody was'} preempted this step")

    def try_admit(r):
        k = st["tried"]
        if preempted:
            raise LabFailure("admit", f"tried to admit {name(r)} in a step that preempted: "
                                      "the newcomer would take the pages the preempted "
                                      "request needs back (admit no one)", case)
        if st["refused"] is not None:
            raise LabFailure("admit", f"tried {name(r)} after {name(st['refused'])} did not "
                                      "fit: first come, first served (a later request "
                                      "never passes it)", case)
        if k >= len(queue) or r is not queue[k]:
            nxt = name(queue[k]) if k < len(queue) else "nobody"
            raise LabFailure("admit", f"tried {name(r)}; the next in the queue is {nxt}", case)
        if r.seats > st["seats"]:
            raise LabFailure("admit", f"tried {name(r)}, which takes {r.seats} seat(s), with "
                                      f"{st['seats']} left", case)
        st["tried"] += 1
        got = sched.admit_one(r, st["budget"], out) if st["budget"] > 0 else None
        if got is None:
            st["refused"] = r
            return False
        st["budget"] -= got
        st["seats"] -= r.seats
        return True

    got = learner.call("admit", list(queue), seats, preempted, try_admit, case=case)
    k = st["tried"]
    if not preempted and st["refused"] is None and k < len(queue) and st["budget"] > 0 \
            and queue[k].seats <= st["seats"]:
        raise LabFailure("admit", f"stopped before {name(queue[k])}, which has a seat: admit "
                                  "while seats allow, until one does not fit", case)
    admitted = [r for r in queue[:k] if r not in sched.waiting]
    if list(got) != admitted:
        raise LabFailure("admit", [f"returned {names(got)}", f"admitted {names(admitted)}"],
                         case)


class LabScheduler(Scheduler):
    """The package's scheduler, with the two decisions asked of the learner."""

    learner = None

    def schedule(self):
        before = self.num_preemptions
        seats, self.max_num_seqs = self.max_num_seqs, 0    # the running pass only
        try:
            out = super().schedule()
        finally:
            self.max_num_seqs = seats
        budget = self.max_num_batched_tokens - sum(n for _, n, _ in out.scheduled)
        call_admit(self.learner, self, out, budget, self.num_preemptions > before)
        return out

    def _make_room(self, req, n):
        if len(self.running) == 1 or req.num_computed_tokens + n > self._arena_tokens:
            return super()._make_room(req, n)              # alone, or the arena's cap
        return call_make_room(self.learner, self, req, n)

    # The scheduler's operations, as the learner's callbacks use them.
    def preempt(self, req):
        self.running.remove(req)
        self._preempt(req)

    def tokens_that_fit(self, req) -> int:
        return self._tokens_that_fit(req)

    def admit_one(self, req, budget: int, out):
        """Admit ``req`` (first chunk at most ``budget`` tokens); its tokens, or None."""
        got = self._admit(req, budget)
        if got is None:
            return None
        n, slots, n_known, n_hit = got
        self.waiting.remove(req)
        self.num_admissions += 1
        self.running.append(req)
        out.scheduled.append((req, n, slots))
        out.admitted.append((req, n_known, n_hit))
        return n


def check(learner, rng) -> None:
    """Small cramped engines on the toy model, decision by decision, against the package."""
    import paged_np as pnp

    from ..registry import SCHEDULERS
    from . import runs
    from .runner import installed

    model, tok = runs.toy_model()
    with installed([swap(learner)]) as options:
        assert SCHEDULERS.load(options["scheduler"]).learner is learner
        for k in range(8):
            reqs = [(rng.integers(3, 300, int(rng.integers(2, 10))).tolist(),
                     int(rng.integers(4, 12))) for _ in range(int(rng.integers(3, 6)))]
            params = [pnp.SamplingParams(max_tokens=m, temperature=0.0) for _, m in reqs]
            w = runs.Workload(f"a small server (case {k}: {len(reqs)} requests, "
                              f"prompts of {[len(p) for p, _ in reqs]} tokens)", model, tok,
                              [p for p, _ in reqs], params,
                              [f"request r{i}" for i in range(len(reqs))],
                              dict(num_pages=int(rng.integers(6, 11)), page_size=4,
                                   max_num_seqs=4, max_num_batched_tokens=64))
            want = runs.serve(w, {"backend": "numba"}, "the package")
            got = runs.serve(w, {"backend": "numba", **options}, "make_room")
            runs.compare(w, got, want, "make_room", ("schedule", "tokens"))


def swap(learner):
    from ..registry import SCHEDULERS
    from .runner import Swap

    cls = type("LabSched", (LabScheduler,), {"learner": learner})
    return Swap(entries=[(SCHEDULERS, cls)], compare=("tokens", "schedule"))
