"""Attention sinks + sliding window on the cuda backend (tests/test_attention_sinks.py)."""

import pytest
import test_attention_sinks as sinks_tests

pytestmark = pytest.mark.cudasim


@pytest.mark.parametrize("page_size,window,sinks", [(4, 10, 3), (3, 7, 5), (16, 12, 4)])
def test_cuda_decode_and_chunks_see_sinks_and_window(page_size, window, sinks):
    """Decode, a whole prompt, chunks across and past the window; holes between."""
    sinks_tests.check_sinks("cuda", page_size, window, sinks, [20, 1, 6], [20, 41, 30])


def test_cuda_split_k_and_gqa_see_sinks():
    from paged_np.attention import numba_cuda

    case, q_sinks, _ = sinks_tests.sink_case(4, 12, 4, None, [90, 60], heads=(8, 2))
    out, _ = numba_cuda.forward(*case.args()[:5], case.qsl, 0.25, 12, False, num_splits=3,
                                attention_sinks=4, q_sinks=q_sinks)
    want = sinks_tests.dense_ref_scaled(case, q_sinks, 12, 4, 0.25)
    assert sinks_tests.rel_error(out, want) <= sinks_tests.TOL
