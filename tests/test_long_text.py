"""``eval --long-text``: perplexity per segment past the window, pages bounded, one JSON."""

from __future__ import annotations

import json

import numpy as np

from paged_np.cli import eval as eval_cli
from paged_np.engine.long_text import long_text, long_text_info, segment_perplexity


def test_the_long_text_ships_with_python_and_is_long():
    info = long_text_info()
    assert info["chars"] > 300_000 and len(info["sha256"]) == 64
    from paged_np.engine.perplexity import eval_text

    assert eval_text() in long_text()                 # the short eval's chapter is in it


def test_segment_perplexity_skips_the_unscored_first_token():
    lps = np.array([np.nan, np.log(0.5), np.log(0.5), np.log(0.25)])
    assert np.allclose(segment_perplexity(lps, 2), [2.0, np.exp(-np.log(0.125) / 2)])


def test_long_text_mode_writes_three_curves_with_bounded_pages(tmp_path, capsys):
    out, png = tmp_path / "lt.json", tmp_path / "lt.png"
    assert eval_cli.main(["--model", "tiny-random", "--long-text", "--num-tokens", "300",
                          "--segment", "64", "--sliding-window", "32", "--page-size", "8",
                          "--sweep", "attention_sinks=0,4", "--backend", "numpy",
                          "--json", str(out), "--plot", str(png)]) == 0
    table = capsys.readouterr().out
    assert "| tokens | full attention | window 32 | 4 sinks + window 32 |" in table
    data = json.loads(out.read_text())
    full, window, sinks = data["runs"]
    assert full["num_tokens"] == window["num_tokens"] == sinks["num_tokens"] == 300
    assert len(sinks["segment_perplexity"]) == 5
    # 32 keys + a chunk of 256 queries + the sink page, in pages of 8, never more.
    assert max(sinks["pages_in_use"]) <= 1 + (32 + 256) // 8 + 1
    assert full["config"]["sliding_window"] is None and sinks["config"]["attention_sinks"] == 4
    assert png.stat().st_size > 0


def test_full_attention_runs_only_where_the_models_positions_reach():
    import paged_np as pnp
    from paged_np.engine.perplexity import EvalRun

    base = pnp.EngineConfig(sliding_window=64, page_size=8)
    sinks = pnp.EngineConfig.from_options(base, attention_sinks=4)
    runs = [EvalRun("reference", base), EvalRun("attention_sinks=4", sinks)]
    out, cut = eval_cli.long_runs(runs, pnp.ModelConfig(max_position_embeddings=100), 300)
    assert [r.label for r in out] == ["full attention", "4 sinks + window 64"]
    assert cut == {"full attention": 100} and out[0].config.num_pages == 13 + 2
