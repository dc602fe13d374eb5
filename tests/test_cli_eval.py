"""``python -m paged_np eval`` on the tiny random model: the perplexity it prints is the dense
path's, every sweep value is a run compared with the reference, bad sweeps are refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from paged_np.cli import eval as eval_cli
from paged_np.cli.serve import tiny_model
from paged_np.engine.logprobs import log_softmax
from paged_np.engine.perplexity import eval_text_info, eval_token_ids


def test_eval_prints_and_writes_the_dense_perplexity(tmp_path, capsys):
    out = tmp_path / "eval.json"
    assert eval_cli.main(["--model", "tiny-random", "--num-tokens", "48", "--backend", "numpy",
                          "--sweep", "max_num_batched_tokens=8,48", "--sweep", "page_size=4",
                          "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["text"]["sha256"] == eval_text_info()["sha256"]
    labels = [r["label"] for r in data["runs"]]
    assert labels == ["reference", "max_num_batched_tokens=8", "max_num_batched_tokens=48",
                      "page_size=4"]
    assert all(f"| {label} |" in printed for label in labels)
    # The truth: exp(-mean log p) from the dense path's log-softmax, no cache at all.
    model, tok = tiny_model()
    ids = eval_token_ids(tok, 48)
    lp = log_softmax(model.dense_logits(ids))[np.arange(47), ids[1:]]
    want = float(np.exp(-lp.mean()))
    for r in data["runs"]:
        assert r["num_scored"] == 47
        assert r["perplexity"] == pytest.approx(want, rel=1e-5)
        assert abs(r["kl_mean"]) < 1e-6 and r["top1"] == 1.0    # same model, same numbers
    assert data["runs"][3]["config"]["page_size"] == 4
    assert data["runs"][3]["pages_per_mib"] == pytest.approx(4 * data["runs"][0]["pages_per_mib"])


@pytest.mark.parametrize("flag, value", [
    ("--sweep", "nonsense=1,2"), ("--sweep", "page_size"), ("--sweep", "page_size=0"),
    ("--sweep", "num_pages=x"),
    ("--weights", ""), ("--weights", "float32,int4"), ("--weights", "gguf;none")])
def test_a_bad_sweep_or_weights_is_refused_before_loading(flag, value, capsys):
    with pytest.raises(SystemExit) as e:
        eval_cli.main(["--model", "no-such-model", flag, value])
    assert e.value.code == 2
    assert flag in capsys.readouterr().err


def test_a_cache_too_small_for_the_slice_fails_with_the_reason(capsys):
    assert eval_cli.main(["--model", "tiny-random", "--num-tokens", "40", "--num-pages", "2",
                          "--page-size", "4", "--backend", "numpy"]) == 1
    assert "can never fit" in capsys.readouterr().err


def test_weights_on_the_tiny_model_are_refused(capsys):
    with pytest.raises(SystemExit) as e:
        eval_cli.main(["--model", "tiny-random", "--weights", "none,gguf"])
    assert e.value.code == 2
    assert "float32 weights only" in capsys.readouterr().err
