"""Lab 6, solved: the scheduling decision. Try the lab (labs/06_scheduler.py) first."""


def make_room(running, req, fits, preempt):
    """Preempt newest-first until ``fits()``; True if ``req`` still runs, else False."""
    while not fits():
        victim = running[-1]          # the newest: it has the least work to lose
        preempt(victim)
        if victim is req:
            return False              # it preempted itself: the step ends
    return True


def admit(waiting, seats, preempted, try_admit):
    """Admit ``waiting`` requests in order while seats allow; returns those admitted."""
    if preempted:                     # the pages just freed are for the preempted
        return []
    admitted = []
    for r in waiting:                 # first come, first served
        if r.seats > seats or not try_admit(r):
            break                     # nobody passes a request that does not fit
        seats -= r.seats
        admitted.append(r)
    return admitted
