"""The real-model demo's flow on a tiny GGUF checkpoint: answers, summary, verified N/N;
and its failures: a model that cannot load, a wrong token, a wrong ending."""

from __future__ import annotations

import copy

from model_files import tiny_real_model, write_gguf

import paged_np as pnp
from paged_np.cli import demo, demo_model


def test_demo_serves_a_gguf_checkpoint_and_verifies(tmp_path, capsys):
    tok = pnp.Tokenizer.tiny()
    path = tmp_path / "tiny.gguf"
    write_gguf(path, tiny_real_model(tok), tok)
    png = tmp_path / "run.png"
    status = demo.main(["--model", str(path), "--requests", "5", "--max-tokens", "12",
                        "--pages", "12", "--page-size", "8", "--max-num-seqs", "5",
                        "--backend", "numpy", "--out", str(png)])
    out = capsys.readouterr().out
    assert status == 0, out
    assert out.count("\nQ") == 5 and "A: " in out
    assert "JIT compile" in out and "verified: 5/5 requests" in out
    assert "preemptions" in out and png.is_file()


def test_demo_without_a_model_exits_1_with_the_reason(tmp_path, capsys):
    missing = tmp_path / "nope.gguf"
    assert demo.main(["--model", str(missing)]) == 1
    err = capsys.readouterr().err
    assert "cannot load" in err and "nope.gguf" in err
    tok = pnp.Tokenizer.tiny()
    write_gguf(tmp_path / "tiny.gguf", tiny_real_model(tok), tok)
    assert demo.main(["--model", str(tmp_path / "tiny.gguf"), "--pages", "2", "--page-size",
                      "8", "--backend", "numpy"]) == 1                  # prompts never fit
    assert "--pages" in capsys.readouterr().err


def test_verify_catches_a_wrong_token_and_a_wrong_ending():
    tok = pnp.Tokenizer.tiny()
    model = pnp.LlamaModel.random(pnp.ModelConfig(vocab_size=tok.vocab_size), seed=0)
    llm = pnp.LLM(model, tokenizer=tok, num_pages=32, backend="numpy", verbose=False)
    outs = llm.generate(["Hello", "The cache"], pnp.SamplingParams(max_tokens=6, temperature=0,
                                                                   ignore_eos=True))
    ok, ties, problems = demo_model.verify(model, outs, tok.stop_token_ids, 6)
    assert (ok, ties, problems) == (2, [], [])
    wrong = copy.deepcopy(outs)
    ids = wrong[0].outputs[0].token_ids
    ids[2] = (ids[2] + 1) % tok.vocab_size
    short = copy.deepcopy(outs)
    del short[1].outputs[0].token_ids[-1]                     # "length" with 5 of 6 tokens
    assert demo_model.verify(model, wrong, tok.stop_token_ids, 6)[2] == [
        f"request {wrong[0].request_id}: token 2 differs from the dense argmax"]
    assert "finish_reason 'length'" in demo_model.verify(model, short, tok.stop_token_ids, 6)[2][0]
