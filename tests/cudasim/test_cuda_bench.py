"""The cuda bench runs end to end (smoke size on the simulator)."""

import pytest

from paged_np.cli import bench_cuda

pytestmark = pytest.mark.cudasim


def test_bench_cuda_runs_and_reports():
    res = bench_cuda.run(None)
    assert res["backend"] == "cuda" and res["dtype"] == "float16"
    assert res["kv_bytes"] == 2 * res["batch"] * res["context"] * res["num_kv_heads"] * \
        res["head_dim"] * 2
    if res["simulator"]:
        assert res["gb_s"] is None and "simulator" in res["note"]
    else:
        assert res["gb_s"] > 0 and 0 < res["pct_of_copy"]
