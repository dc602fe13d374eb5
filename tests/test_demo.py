"""python -m paged_np demo: serves, verifies, draws; fails loudly if a token differs."""

from __future__ import annotations

from paged_np.cli import demo
from paged_np.models.llama import LlamaModel

ARGS = ["--model", "tiny", "--requests", "6", "--pages", "24", "--page-size", "8",
        "--backend", "numpy"]


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
    monkeypatch.setattr(LlamaModel, "dense_generate", lambda self, p, n: [0] * n)
    assert demo.main(ARGS + ["--out", str(tmp_path / "x.png")]) == 1
    assert "verified: 0/6" in capsys.readouterr().out


def test_workload_shares_a_system_prompt():
    work = demo.make_workload(6, 256, seed=0)
    assert work[0][1][:48] == work[2][1][:48] == work[4][1][:48]
    assert [a for a, _, _ in work] == [0, 0, 1, 1, 2, 2]


def _tamper(monkeypatch, change):
    """Run the real replay, then ``change(outs)`` before the demo checks them."""
    real = demo.replay

    def replay(engine, work, on_finish=None):
        outs = real(engine, work, on_finish)
        change(outs)
        return outs

    monkeypatch.setattr(demo, "replay", replay)


def test_demo_catches_a_truncated_request(tmp_path, capsys, monkeypatch):
    """Right tokens, too few of them: the old length-blind check passed this."""
    def truncate(outs):
        s = outs[1].samples[0]
        s.token_ids = s.token_ids[:-3]
        s.finish_reason = "stop"

    _tamper(monkeypatch, truncate)
    assert demo.main(ARGS + ["--out", str(tmp_path / "x.png")]) == 1
    text = capsys.readouterr().out
    assert "verified: 5/6" in text and "request 1:" in text and "'stop'" in text


def test_demo_exits_nonzero_when_a_request_failed(tmp_path, capsys, monkeypatch):
    def fail(outs):
        outs[2].samples[0].token_ids = []
        outs[2].samples[0].finish_reason = "error"
        outs[2].error = "it can never fit"

    _tamper(monkeypatch, fail)
    assert demo.main(ARGS + ["--no-verify", "--out", str(tmp_path / "x.png")]) == 1
    assert "request 2 failed: it can never fit" in capsys.readouterr().out
    assert demo.main(ARGS + ["--out", str(tmp_path / "y.png")]) == 1
    assert "verified: 5/6" in capsys.readouterr().out


def test_compile_time_is_reported_apart_and_kept_out_of_tokens_per_s(tmp_path, capsys,
                                                                     monkeypatch):
    """A first model call made slow (as a cold JIT compile is) must not land in serving time."""
    import re
    import time

    real_forward = LlamaModel.forward
    seconds = {}                                     # per cache: time in forward, no sleep
    slept = []

    def forward(self, batch, cache, *args, **kwargs):
        if not slept:
            slept.append(True)
            time.sleep(3.0)                          # the stand-in for compiling
        t0 = time.perf_counter()
        out = real_forward(self, batch, cache, *args, **kwargs)
        seconds[id(cache)] = seconds.get(id(cache), 0.0) + time.perf_counter() - t0
        return out

    engines = []

    class Recording(demo.Engine):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            engines.append(self)

    monkeypatch.setattr(LlamaModel, "forward", forward)
    monkeypatch.setattr(demo, "Engine", Recording)
    assert demo.main(ARGS + ["--no-verify", "--out", str(tmp_path / "x.png")]) == 0
    text = capsys.readouterr().out
    compile_s = float(re.search(r"JIT compile[^:]*: ([\d.]+) s", text).group(1))
    assert compile_s >= 3.0
    served = max(engines, key=lambda e: e.metrics["steps"])     # served the workload
    assert served.metrics["model_s"] < seconds[id(served.cache)] + 1.0
