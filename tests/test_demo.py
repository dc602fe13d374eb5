"""python -m paged_np demo: serves, verifies, draws; fails loudly if a token differs."""

from __future__ import annotations

from paged_np.cli import demo
from paged_np.models.llama import TinyLlama

ARGS = ["--requests", "6", "--pages", "24", "--page-size", "8", "--backend", "numpy"]


def test_demo_serves_verifies_and_draws(tmp_path, capsys):
    out = tmp_path / "run.png"
    assert demo.main(ARGS + ["--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "verified: 6/6 requests identical to the dense reference" in text
    for row in ("generated tokens", "tokens/s", "peak pages in use", "prefix hit rate",
                "evictions", "preemptions"):
        assert row in text
    assert out.stat().st_size > 10_000


def test_demo_exits_nonzero_when_a_request_differs(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(TinyLlama, "dense_generate", lambda self, p, n: [0] * n)
    assert demo.main(ARGS + ["--out", str(tmp_path / "x.png")]) == 1
    assert "verified: 0/6" in capsys.readouterr().out


def test_workload_shares_a_system_prompt():
    work = demo.make_workload(6, 256, seed=0)
    assert work[0][1][:48] == work[2][1][:48] == work[4][1][:48]
    assert [a for a, _, _ in work] == [0, 0, 1, 1, 2, 2]
