"""Synthetic traces: the length distributions match the published means, and
the sharing structure (chats, few-shot, beam trees) is what the simulation assumes."""

import numpy as np
import pytest

from paged_np.errors import InvalidArgument
from paged_np.sim import workloads as wl


@pytest.mark.parametrize("mu,sigma,lo,hi", [(4.0, 1.1, 1, 1024), (2.5, 0.6, 1, 50),
                                            (6.5, 0.8, 1, 1024)])
def test_clipped_lognormal_mean_matches_monte_carlo(mu, sigma, lo, hi):
    x = np.clip(np.random.default_rng(0).lognormal(mu, sigma, 400_000), lo, hi)
    assert wl.clipped_lognormal_mean(mu, sigma, lo, hi) == pytest.approx(x.mean(), rel=5e-3)


def test_solve_mu_inverts_the_mean():
    mu = wl.solve_mu(161.31, 1.1, 1.0, 1024.0)
    assert wl.clipped_lognormal_mean(mu, 1.1, 1.0, 1024.0) == pytest.approx(161.31, rel=1e-9)
    with pytest.raises(InvalidArgument, match="mean"):
        wl.solve_mu(2000.0, 1.0, 1.0, 1024.0)


@pytest.mark.parametrize("model", [wl.SHAREGPT, wl.ALPACA])
def test_sampled_means_match_the_paper(model):
    ins, outs = wl.sample_lengths(model, 200_000, np.random.default_rng(1))
    assert ins.mean() == pytest.approx(model.input_mean, rel=0.02)
    assert outs.mean() == pytest.approx(model.output_mean, rel=0.02)
    assert ins.min() >= 1 and ins.max() <= model.max_input
    assert outs.min() >= 1 and outs.max() <= model.max_output


def test_sharegpt_is_longer_than_alpaca_as_published():
    # The paper: 8.4x longer inputs, 5.8x longer outputs on average.
    assert wl.SHAREGPT.input_mean / wl.ALPACA.input_mean == pytest.approx(8.4, abs=0.05)
    assert wl.SHAREGPT.output_mean / wl.ALPACA.output_mean == pytest.approx(5.8, abs=0.05)


def _same(a, b):
    return len(a) == len(b) and all(
        np.array_equal(x.prompt, y.prompt) and np.array_equal(x.output, y.output)
        for x, y in zip(a, b))


def test_traces_are_deterministic_for_a_seed():
    g = np.random.default_rng
    sharegpt = [wl.sample_requests(wl.SHAREGPT, 50, g(3)) for _ in range(2)]
    assert _same(*sharegpt)
    assert _same(wl.chat_trace(g(3), 10), wl.chat_trace(g(3), 10))
    assert _same(wl.fewshot_trace(g(3), 30), wl.fewshot_trace(g(3), 30))
    assert not _same(wl.chat_trace(g(3), 10), wl.chat_trace(g(4), 10))


def test_chat_turns_extend_the_previous_turn_and_its_reply():
    trace = wl.chat_trace(np.random.default_rng(0), num_conversations=12, max_context=2048)
    last = {}
    for r in trace:
        assert r.total_len <= 2048
        if r.group in last:
            prev = last[r.group]
            history = np.concatenate([prev.prompt, prev.output])
            assert r.input_len > len(history)
            assert np.array_equal(r.prompt[:len(history)], history)
        last[r.group] = r
    assert len(last) > 1 and len(trace) > len(last)  # several conversations, several turns
    # Conversations interleave: some turn arrives between two turns of another chat.
    groups = [r.group for r in trace]
    assert any(groups[i] != groups[i + 1] and groups[i] in groups[i + 2:]
               for i in range(len(groups) - 2))


def test_fewshot_requests_of_a_task_share_its_prefix():
    trace = wl.fewshot_trace(np.random.default_rng(0), num_requests=40, num_tasks=3, shots=4)
    by_task = {}
    for r in trace:
        by_task.setdefault(r.group, []).append(r.prompt)
    for prompts in by_task.values():
        common = min(len(p) for p in prompts) - 1
        shared = 0
        while shared < common and all(p[shared] == prompts[0][shared] for p in prompts):
            shared += 1
        assert len(prompts) == 1 or shared >= 4  # at least the examples' first tokens


@pytest.mark.parametrize("width", [1, 2, 4, 6])
def test_beam_tree_shape_and_first_step(width):
    parents, tokens = wl.beam_search_tree(width, 30, np.random.default_rng(0), ambiguity=0.3)
    assert parents.shape == tokens.shape == (30, width)
    assert (parents[0] == 0).all()  # the prompt is the only beam at first
    assert ((0 <= parents) & (parents < width)).all()
    for t in range(30):  # the k winners are k different (parent, token) candidates
        assert len(set(zip(parents[t], tokens[t]))) == width


def test_beam_tree_prunes_and_forks_more_with_more_ambiguity():
    def forks(a):
        p, _ = wl.beam_search_tree(4, 400, np.random.default_rng(0), ambiguity=a)
        return sum(len(set(row)) < 4 for row in p[1:])  # steps where some beam was pruned

    assert forks(0.0) < forks(0.2) < forks(0.8)


def test_beam_tree_rejects_bad_arguments():
    with pytest.raises(InvalidArgument, match="vocab"):
        wl.beam_search_tree(10, 5, np.random.default_rng(0), vocab=8)
    with pytest.raises(InvalidArgument, match="ambiguity"):
        wl.beam_search_tree(2, 5, np.random.default_rng(0), ambiguity=1.5)
