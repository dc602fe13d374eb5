"""Run a lab: load the learner's file, check it, swap it into the engine, serve, compare.

One lab, in four stages, stopping at the first refusal:

1. **Not done yet?** A function whose body is still the stub's.
2. **The function alone**: the lab's ``check(learner, rng)``, random cases and
   hidden edge cases, each answer against the package's.
3. **Inside the engine**: the lab's ``swap(learner)`` says how its pieces
   enter the seams (cache and index classes to build from mixins, registry
   entries); :func:`installed` registers them under private names, the
   engine is built with the options that choose them, and everything is
   unregistered afterwards, whatever happened.
4. **The same as the package**: the toy workload, then the SmolLM2 chats,
   each served with the learner's pieces and with the package's own
   (:mod:`.runs`), compared token by token.

:func:`run` runs one lab; ``run("all", DIR)`` loads every lab's file from
``DIR``, checks each alone, then swaps all of them in at once: SmolLM2 on
nothing but the learner's pieces.
"""

from __future__ import annotations

import importlib
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import InvalidArgument
from ..registry import ATTENTION_BACKENDS, KV_CACHES, PREFIX_INDEXES
from . import runs
from .learner import Learner
from .report import LabFailure, NotDoneYet, format_refusal

#: The labs, in course order: name -> the module that runs it.
LABS = {
    "slots": "paged_np.labs.slots",
    "attention": "paged_np.labs.attention",
    "prefix": "paged_np.labs.prefix",
    "cow": "paged_np.labs.cow",
    "eviction": "paged_np.labs.eviction",
    "scheduler": "paged_np.labs.scheduler",
    "sampler": "paged_np.labs.sampler",
    "step": "paged_np.labs.step",
}
#: The private names the lab's pieces are registered under while a lab runs.
PREFIX = "_lab_"


@dataclass
class Swap:
    """How a lab's pieces enter the engine.

    ``cache_mixins`` / ``index_mixins``: classes put in front of
    :class:`~paged_np.PagedKVCache` / :class:`~paged_np.HashIndex` (several labs
    change the same class: ``lab all`` stacks their mixins); ``entries``:
    ``(registry, target)`` pairs, each chosen by its registry's option;
    ``reference``: options the package's own run needs to be comparable (the
    same eviction policy the lab asks for, say); ``compare``: what must
    equal the package's run besides the tokens; ``forks``: whether the
    workloads may fork samples (``n > 1``).
    """

    cache_mixins: list = field(default_factory=list)
    index_mixins: list = field(default_factory=list)
    entries: list = field(default_factory=list)
    reference: dict = field(default_factory=dict)
    compare: tuple = ("tokens",)
    forks: bool = True


@dataclass
class Result:
    """How a lab went: ``status`` is "accepted", "not done yet" or "not right yet"."""

    lab: str
    status: str
    message: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.status == "accepted"


def lab_module(name: str):
    if name not in LABS:
        raise InvalidArgument(f"lab must be one of {tuple(LABS) + ('all',)}, got {name!r}")
    return importlib.import_module(LABS[name])


@contextmanager
def installed(swaps: list[Swap]):
    """Register the swaps' pieces under private names; yield the options choosing them."""
    from ..cache.hash_index import HashIndex
    from ..cache.kv_cache import PagedKVCache

    done, options = [], {}

    def register(registry, target, **meta):
        name = f"{PREFIX}{registry.option.replace('.', '_')}"
        registry.register(name, target, "a lab's", replace=True, **meta)
        done.append((registry, name))
        options[registry.option] = name

    try:
        cache = [m for s in swaps for m in s.cache_mixins]
        if cache:
            register(KV_CACHES, type("LabCache", (*cache, PagedKVCache), {}))
        index = [m for s in swaps for m in s.index_mixins]
        if index:
            register(PREFIX_INDEXES, type("LabIndex", (*index, HashIndex), {}))
        for s in swaps:
            for registry, target in s.entries:
                register(registry, target, engine=True)
        yield options
    finally:
        for registry, name in done:
            registry.unregister(name)


@contextmanager
def package_attention():
    """The package's NumPy backend under a private name, so the reference run of an
    attention lab takes the same (fused) model path as the learner's backend."""
    name = f"{PREFIX}numpy"
    ATTENTION_BACKENDS.register(name, ATTENTION_BACKENDS["numpy"].target,
                                "the package's, for a lab", replace=True, engine=True)
    try:
        yield name
    finally:
        ATTENTION_BACKENDS.unregister(name)


_REFERENCES: dict = {}


def reference(w, options: dict) -> runs.Trace:
    """The package's own run of ``w`` with ``options`` (kept for the process)."""
    key = (w.name, id(w.model), repr(w.prompts), repr(w.params), repr(w.options),
           repr(sorted(options.items())))
    if key not in _REFERENCES:
        _REFERENCES[key] = runs.serve(w, options, "the package")
    return _REFERENCES[key]


def serve_and_compare(swaps, blame: str, smollm2, seed: int) -> None:
    """Stages 3 and 4 for these swaps (one lab's, or every lab's)."""
    forks = all(s.forks for s in swaps)
    compare = tuple({c for s in swaps for c in s.compare})
    ref_options = {"backend": "numba"}
    for s in swaps:
        ref_options.update(s.reference)
    with installed(swaps) as options, package_attention() as numpy_name:
        mine = {"backend": "numba", **options}
        if "backend" in options:             # the learner's attention: the same model path
            ref_options["backend"] = numpy_name
        workloads = [runs.toy_workload(seed, forks=forks)]
        if smollm2 is not None:
            workloads.append(runs.smollm2_workload(*smollm2, forks=forks))
        for w in workloads:
            want = reference(w, ref_options)
            got = runs.serve(w, mine, blame)
            runs.compare(w, got, want, blame, compare)


def run(name: str, path, *, hint: int = 1, seed: int | None = None, smollm2="load",
        check_only: bool = False) -> Result:
    """Run lab ``name`` (or ``"all"``) on the learner's file (a folder for "all").

    ``smollm2``: ``(model, tokenizer)``, ``"load"`` (load it now) or None (the toy
    workload only); ``seed`` picks the random cases and the toy workload;
    ``check_only`` stops after stage 2. Never raises for the learner's code: the
    verdict and its message are in the :class:`Result`.
    """
    t0 = time.perf_counter()
    seed = int(np.random.default_rng().integers(10**6)) if seed is None else seed
    names = list(LABS) if name == "all" else [name]
    mods = {n: lab_module(n) for n in names}
    folder = Path(path)
    paths = {n: folder / mods[n].FILE if name == "all" else folder for n in names}
    current = names[0]
    try:
        learners = {}
        for n in names:                                          # 1. not done yet?
            current = n
            learners[n] = Learner(paths[n], mods[n].FUNCTIONS)
            if learners[n].stubs:
                raise NotDoneYet(learners[n].stubs[0], str(paths[n]))
        for n in names:                                          # 2. alone
            current = n
            mods[n].check(learners[n], np.random.default_rng(seed))
        if not check_only:                                       # 3, 4. in the engine
            if smollm2 == "load":
                import paged_np as pnp

                smollm2 = pnp.load_model("smollm2-135m-instruct")
            swaps = [mods[n].swap(learners[n]) for n in names]
            blame = mods[name].BLAME if name != "all" else "one of your pieces"
            serve_and_compare(swaps, blame, smollm2, seed)
    except NotDoneYet as e:
        left = [f for f in mods[current].FUNCTIONS
                if f in getattr(learners.get(current), "stubs", [e.function])] or [e.function]
        msg = (f"lab {current}: not done yet: {', '.join(left)} still raise"
               f"{'s' if len(left) == 1 else ''} NotImplementedError ({paths[current]}). "
               "Fill in the body, then run this again.")
        return Result(name, "not done yet", msg, time.perf_counter() - t0)
    except LabFailure as e:
        owner = next((n for n in names if e.function in mods[n].FUNCTIONS), current)
        msg = format_refusal(current if name != "all" else f"all ({owner})", e,
                             str(paths.get(owner, path)), mods[owner].HINTS, hint)
        return Result(name, "not right yet", msg + f"\n  (seed {seed})",
                      time.perf_counter() - t0)
    took = time.perf_counter() - t0
    what = "its functions alone" if check_only else (
        "the toy workload and SmolLM2" if smollm2 is not None else "the toy workload")
    msg = (f"lab {name}: accepted ({what}; seed {seed}; {took:.0f} s). "
           + ("Every greedy token equals the package's, the cache's invariants held "
              "and no page leaked." if not check_only else ""))
    return Result(name, "accepted", msg.strip(), took)
