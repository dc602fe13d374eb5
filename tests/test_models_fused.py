"""The fused per-layer kernels (paged_np.models.fused) against their NumPy twins in llama.py."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import paged_np as pnp
from paged_np.models import fused
from paged_np.models.llama import apply_rope, rms_norm, silu


@settings(max_examples=30, deadline=None)
@given(T=st.integers(1, 9), nq=st.integers(1, 4), nkv=st.integers(1, 2),
       D=st.sampled_from([2, 8, 64]), seed=st.integers(0, 999))
def test_fused_kernels_equal_the_numpy_reference(T, nq, nkv, D, seed):
    rng = np.random.default_rng(seed)
    H, inter = nq * D, 3 * D
    x = rng.standard_normal((T, H), dtype=np.float32)
    w = rng.standard_normal(H, dtype=np.float32)
    np.testing.assert_allclose(fused.rms_norm(x, w, 1e-5), rms_norm(x, w, 1e-5), rtol=1e-5,
                               atol=1e-6)
    qkv = rng.standard_normal((T, (nq + 2 * nkv) * D), dtype=np.float32)
    ang = rng.standard_normal((T, D // 2))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    q, k, v = fused.rope_qk(qkv, cos, sin, nq, nkv, D)
    np.testing.assert_allclose(q, apply_rope(qkv[:, :nq * D].reshape(T, nq, D), cos, sin),
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(k, apply_rope(qkv[:, nq * D:(nq + nkv) * D].reshape(T, nkv, D),
                                             cos, sin), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(v, qkv[:, (nq + nkv) * D:].reshape(T, nkv, D))
    gu = rng.standard_normal((T, 2 * inter), dtype=np.float32)
    np.testing.assert_allclose(fused.silu_mul(gu, inter), silu(gu[:, :inter]) * gu[:, inter:],
                               rtol=1e-5, atol=1e-6)


def test_fused_kernels_refuse_bad_shapes():
    x = np.ones((2, 8), np.float32)
    with pytest.raises(pnp.ShapeError, match="weight"):
        fused.rms_norm(x, np.ones(7, np.float32), 1e-5)
    with pytest.raises(pnp.DTypeError, match="x must be a float32"):
        fused.rms_norm(x.astype(np.float64), np.ones(8, np.float32), 1e-5)
    with pytest.raises(pnp.ShapeError, match="qkv"):
        fused.rope_qk(x, np.ones((2, 1), np.float32), np.ones((2, 1), np.float32), 1, 1, 2)
    with pytest.raises(pnp.ShapeError, match="cos"):
        fused.rope_qk(np.ones((2, 6), np.float32), np.ones((1, 1), np.float32),
                      np.ones((1, 1), np.float32), 1, 1, 2)
    with pytest.raises(pnp.ShapeError, match="gate_up"):
        fused.silu_mul(x, 3)
