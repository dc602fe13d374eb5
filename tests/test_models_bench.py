"""The decode benchmark's arithmetic and the thread pinning it relies on."""

from __future__ import annotations

import numba
import numpy as np
import pytest
from model_files import tiny_real_model

import paged_np as pnp
from paged_np.cli.bench_model import measure_decode, weight_bytes_per_token, write_table
from paged_np.models.blas import get_blas_threads, pinned_threads


def test_weight_bytes_count_every_matrix_once():
    tok = pnp.Tokenizer.tiny()
    for tied in (True, False):
        m = tiny_real_model(tok, tied=tied)
        c = m.cfg
        H, I, L, V = c.hidden_size, c.intermediate_size, c.num_layers, c.vocab_size
        q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        per_layer = H * (q + 2 * kv) + q * H + 3 * H * I + 2 * H
        params = L * per_layer + V * H + H + (0 if tied else H * V)
        assert m.num_parameters == params
        assert weight_bytes_per_token(m) == 4 * params


def test_pinned_threads_sets_and_restores():
    before_blas, before_numba = get_blas_threads(), numba.get_num_threads()
    with pinned_threads(1):
        assert numba.get_num_threads() == 1
        assert get_blas_threads() in (None, 1)
    assert (get_blas_threads(), numba.get_num_threads()) == (before_blas, before_numba)


def test_measure_decode_reports_consistent_numbers():
    model = tiny_real_model(pnp.Tokenizer.tiny())
    r = measure_decode(model, prompt_len=8, n_tokens=4, rounds=1, bandwidth=False)
    assert r["tokens_per_s"] == pytest.approx(1000.0 / r["ms_per_token"])
    assert r["ms_per_token"] <= r["median_ms_per_token"]
    assert r["weight_bytes"] == model.nbytes and r["threads"] == 1
    r.update(bandwidth_gbs=1.0, bound_tokens_per_s=1e9 / model.nbytes,
             transformers_ms_per_token=2 * r["ms_per_token"],
             transformers_median_ms_per_token=2 * r["ms_per_token"],
             transformers_tokens_per_s=r["tokens_per_s"] / 2, speedup_vs_transformers=2.0)
    r["fraction_of_bound"] = r["tokens_per_s"] / r["bound_tokens_per_s"]
    table = write_table([r], "tiny")
    assert "| 1 |" in table and "2.00x" in table
    assert np.isfinite(r["tokens_per_s"])
