"""The bug classes other small engines shipped, on both prefix indexes and both schedules.

Each case is one a paged engine with prefix caching has got wrong before: a
prompt served entirely from the cache (an exact page multiple, and one token
past), the same prompt several times in one step, preemption over shared pages
then re-admission through cache hits, an abort mid-prefill whose prefix a live
request still uses. Every test compares each request's greedy tokens with the
model's dense reference (no cache at all), then checks the cache's invariants
and that no page leaked: once every request is done, each page is free or
cached, none in use.
"""

from __future__ import annotations

import pytest
from engine_helpers import tiny_model

import paged_np as pnp

PAGE = 4
INDEXES = ["hash", "radix"]
SCHEDULES = ["fcfs", "lpm"]


def greedy(k: int) -> pnp.SamplingParams:
    return pnp.SamplingParams(max_tokens=k, temperature=0.0)


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=1)


@pytest.fixture(params=INDEXES)
def prefix_cache(request):
    return request.param


@pytest.fixture(params=SCHEDULES)
def schedule(request):
    return request.param


def make_engine(model, prefix_cache, schedule, **kw) -> pnp.Engine:
    opts = dict(num_pages=64, page_size=PAGE, max_num_seqs=4, max_num_batched_tokens=256,
                backend="numpy")
    return pnp.Engine(model, prefix_cache=prefix_cache, schedule=schedule, **{**opts, **kw})


def assert_no_leak(engine: pnp.Engine) -> None:
    """Invariants hold, nothing runs or waits, and every page is free or cached."""
    engine.cache.check_invariants()
    assert not engine.has_unfinished_requests()
    s = engine.cache.stats()
    assert s["num_in_use"] == 0, s
    assert s["num_free"] + s["num_cached"] == s["num_pages"], s


def tokens(n: int, start: int) -> list[int]:
    """``n`` distinct-looking token ids (a stride through the vocabulary of 128)."""
    return [(start + 37 * i) % 128 for i in range(n)]


def run_until_done(engine: pnp.Engine, max_steps: int = 500) -> dict:
    """Step until nothing is left; the finished outputs by request id."""
    done = {}
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            return done
        for out in engine.step():
            done[out.request_id] = out
    raise AssertionError(f"still unfinished after {max_steps} steps")


# --------------------------------------------------------- a prompt all in the cache
@pytest.mark.parametrize("length", [4 * PAGE, 4 * PAGE + 1, PAGE], ids=["multiple",
                                                                      "one-past", "one-page"])
def test_prompt_whose_every_page_is_cached(model, prefix_cache, schedule, length):
    """The second run hits the cache yet still computes the last prompt token.

    With an exact page multiple every page of the prompt is cached, so an engine
    that trusts the hit entirely has no token left to compute and nothing to
    sample the first output token from (or writes into a shared cached page).
    """
    prompt = tokens(length, start=5)
    k = 6
    want = model.dense_generate(prompt, k)
    engine = make_engine(model, prefix_cache, schedule)
    (first,) = engine.generate([prompt], greedy(k))
    assert first.token_ids == want
    assert first.num_cached_prompt_tokens == 0
    assert_no_leak(engine)

    before = engine.metrics["scheduled_tokens"]
    (again,) = engine.generate([prompt], greedy(k))
    assert again.token_ids == want
    cached = again.num_cached_prompt_tokens
    # Every full page before the last token's is hit (for one page of exactly PAGE
    # tokens that is none: like vLLM, the page holding the last token is computed
    # again); the last token itself never is.
    assert ((length - 1) // PAGE) * PAGE <= cached <= length - 1
    if length > PAGE:
        assert cached > 0
    # exactly the uncached prompt tokens, then one decode per token after the first
    assert engine.metrics["scheduled_tokens"] - before == (length - cached) + (k - 1)
    assert_no_leak(engine)

    (third,) = engine.generate([prompt], greedy(k))   # and a third time: the pages survived
    assert third.token_ids == want
    assert third.num_cached_prompt_tokens == cached
    assert_no_leak(engine)


@pytest.mark.parametrize("length", [4 * PAGE, 4 * PAGE + 1], ids=["multiple", "one-past"])
def test_cached_prompt_continued_by_a_longer_prompt(model, prefix_cache, schedule, length):
    """A cached prompt, then that prompt plus its answer (a chat's next turn)."""
    prompt = tokens(length, start=9)
    engine = make_engine(model, prefix_cache, schedule)
    (first,) = engine.generate([prompt], greedy(5))
    turn2 = prompt + first.token_ids + tokens(3, start=70)
    (second,) = engine.generate([turn2], greedy(5))
    assert second.token_ids == model.dense_generate(turn2, 5)
    assert second.num_cached_prompt_tokens >= (length // PAGE) * PAGE
    assert_no_leak(engine)


# ------------------------------------------------- the same prompt several times in one step
@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
@pytest.mark.parametrize("length", [8 * PAGE, 8 * PAGE - 2], ids=["multiple", "partial"])
def test_same_long_prompt_several_times_in_one_step(model, prefix_cache, schedule, length,
                                                    warm):
    """Four copies admitted together: cold (none cached yet) or warm (all cached).

    Cold, each copy computes pages another copy is computing in the same
    step, and the index sees the same page content inserted several times; warm,
    all four hit the same cached pages and, for an exact multiple, all four must
    compute their last token without writing into a page the others read.
    """
    prompt = tokens(length, start=3)
    copies = 4
    k = 5
    want = model.dense_generate(prompt, k)
    engine = make_engine(model, prefix_cache, schedule, max_num_seqs=copies,
                         max_num_batched_tokens=copies * length)
    if warm:
        (out,) = engine.generate([prompt], greedy(k))
        assert out.token_ids == want
    steps = engine.metrics["steps"]
    outs = engine.generate([prompt] * copies, greedy(k))
    assert [o.token_ids for o in outs] == [want] * copies
    assert engine.metrics["series"]["running"][steps] == copies   # admitted in one step
    if warm:
        assert all(o.num_cached_prompt_tokens > 0 for o in outs)
    assert_no_leak(engine)
    # and once more, now surely from the cache
    outs = engine.generate([prompt] * copies, greedy(k))
    assert [o.token_ids for o in outs] == [want] * copies
    assert all(o.num_cached_prompt_tokens > 0 for o in outs)
    assert_no_leak(engine)


# ------------------------------------------------- preemption over shared pages
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_over_shared_pages_then_readmission(model, prefix_cache, schedule, mode):
    """Requests sharing a system prompt outgrow a small cache, are preempted, come back.

    Preempting a request must drop only its own references to the shared
    pages; coming back, it finds the prefix (still held by the others, or
    cached) and recomputes or swaps in only the rest.
    """
    system = tokens(4 * PAGE, start=11)                       # 4 shared pages
    ps = [system + tokens(3 + i % 4, start=50 + 7 * i) for i in range(6)]
    k = 14
    want = [model.dense_generate(p, k) for p in ps]
    engine = make_engine(model, prefix_cache, schedule, num_pages=14, max_num_seqs=4,
                         max_num_batched_tokens=32, preemption_mode=mode)
    outs = engine.generate(ps, greedy(k))
    assert [o.token_ids for o in outs] == want
    assert all(o.finish_reason == "length" for o in outs)
    m = engine.metrics
    assert m["preemptions"] > 0                               # the cache was too small
    assert m["peak_pages_in_use"] <= 14
    if mode == "recompute":
        assert m["readmitted_hit_tokens"] > 0                 # came back through cache hits
    else:
        assert m["swapped_out"] > 0 and m["swapped_in"] > 0
    assert m["prefix_hit_tokens"] > 0                         # the system prompt was shared
    assert_no_leak(engine)

    outs = engine.generate(ps[:2], greedy(k))                 # the cache still serves them
    assert [o.token_ids for o in outs] == want[:2]
    assert all(o.num_cached_prompt_tokens >= len(system) for o in outs)
    assert_no_leak(engine)


def test_swap_in_of_a_sequence_whose_every_page_is_cached(model, prefix_cache, schedule):
    """Swapped out with an exact page multiple computed, swapped back in over cache hits.

    The victim (B) is preempted with 40 tokens computed, five full pages of 8,
    all given to the prefix index. Back in, the hit stops a page short (the
    last known token is never served by the cache), so the swap-in writes that
    page again while the index still holds it: the engine must still find the
    pages it counted on, and give the same tokens.
    """
    p1 = tokens(26, start=40)
    p2 = p1[:24] + tokens(13, start=90)                        # shares 3 pages with p1
    k = 7
    engine = make_engine(model, prefix_cache, schedule, num_pages=7, page_size=8,
                         max_num_seqs=3, max_num_batched_tokens=22, preemption_mode="swap")
    outs = engine.generate([p1, p2], greedy(k))
    assert [o.token_ids for o in outs] == [model.dense_generate(p, k) for p in (p1, p2)]
    assert engine.metrics["swapped_in"] > 0
    assert_no_leak(engine)


# ------------------------------------------------- abort mid-prefill over a shared prefix
def _step_until(engine, cond, max_steps=100):
    for _ in range(max_steps):
        engine.step()
        if cond():
            return
    raise AssertionError("condition never reached")


@pytest.mark.parametrize("a_first", [True, False], ids=["A-cached", "together"])
def test_abort_mid_prefill_of_a_request_sharing_a_live_prefix(model, prefix_cache, schedule,
                                                              a_first):
    """A and B share a 4-page prefix; B is aborted halfway through its chunked prefill.

    ``A-cached``: A's prompt is computed first, so B admits on A's pages and
    aborts while they are shared with a live request. ``together``: both are
    queued at once and prefill in chunks side by side, so B may have inserted
    (or be computing) pages of the same prefix when it is dropped. Either way A
    must finish with its reference tokens, the aborted B must give every page it
    held back (shared ones to A or the cache, never to the free list under A),
    and B's prompt served again must match the reference.
    """
    prefix = tokens(4 * PAGE, start=21)
    pa = prefix + tokens(3, start=90)
    pb = prefix + tokens(6 * PAGE, start=60)          # long: B's own part takes chunks too
    k = 8
    want_a, want_b = model.dense_generate(pa, k), model.dense_generate(pb, k)
    engine = make_engine(model, prefix_cache, schedule, max_num_batched_tokens=6)

    a = engine.add_request(pa, greedy(k), request_id="A")
    if a_first:
        out_a = engine.request_output(a)
        _step_until(engine, lambda: len(out_a.token_ids) >= 1)   # A's prompt is computed
    b = engine.add_request(pb, greedy(k), request_id="B")
    out_a, out_b = engine.request_output(a), engine.request_output(b)
    prompt_tokens = engine.metrics["prompt_tokens"]
    # step until B is admitted and has computed part, not all, of its prompt
    _step_until(engine, lambda: engine.metrics["prompt_tokens"] > prompt_tokens)
    if not a_first:     # side by side: give B a second chunk, so it holds computed pages
        engine.step()
    assert out_b.token_ids == [] and not out_b.finished            # still mid-prefill
    assert engine.cache.stats()["num_in_use"] > 0
    if a_first:
        assert out_b.num_cached_prompt_tokens == len(prefix)       # B reads A's pages
    engine.abort(b)
    assert out_b.finish_reason == "abort"
    engine.cache.check_invariants()

    done = run_until_done(engine)
    assert done["A"].token_ids == want_a
    assert done["A"].finish_reason == "length"
    assert_no_leak(engine)

    (again,) = engine.generate([pb], greedy(k))
    assert again.token_ids == want_b
    assert again.num_cached_prompt_tokens >= len(prefix)            # the prefix survived
    assert_no_leak(engine)


def test_abort_of_the_request_whose_pages_another_is_reading(model, prefix_cache, schedule):
    """The other way round: A is aborted mid-prefill while B, on A's prefix, goes on."""
    prefix = tokens(4 * PAGE, start=33)
    pa = prefix + tokens(5 * PAGE, start=80)
    pb = prefix + tokens(2, start=7)
    k = 6
    engine = make_engine(model, prefix_cache, schedule, max_num_batched_tokens=6)
    engine.add_request(pa, greedy(k), request_id="A")
    engine.add_request(pb, greedy(k), request_id="B")
    for _ in range(5):                                  # both are mid-prefill by now
        engine.step()
    assert engine.request_output("A").token_ids == []
    engine.abort("A")
    engine.cache.check_invariants()
    done = run_until_done(engine)
    assert done["B"].token_ids == model.dense_generate(pb, k)
    assert_no_leak(engine)
    (again,) = engine.generate([pa], greedy(k))
    assert again.token_ids == model.dense_generate(pa, k)
    assert_no_leak(engine)
