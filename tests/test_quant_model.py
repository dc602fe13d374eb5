"""The model on quantized weights: the paged engine equals the dense check (both run the
same QuantMatrix layers), quantization on load, the real file's memory and its float32
twin's greedy tokens (the quantized ones are checked in test_models_real.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import paged_np as pnp
from paged_np.models.quantized import quantize_weights
from paged_np.quant import QuantMatrix

GOLDEN = json.loads((Path(__file__).parent / "data" / "smollm2_golden.json").read_text())
CFG = pnp.ModelConfig(vocab_size=320, hidden_size=64, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=16, intermediate_size=96)


@pytest.fixture(scope="module")
def float_model():
    return pnp.LlamaModel.random(CFG, seed=1)


@pytest.fixture(scope="module")
def q8_model(float_model):
    return pnp.LlamaModel(CFG, quantize_weights({k: float_model.w[k] for k in
                                                 pnp.models.llama.weight_shapes(CFG)}))


def test_q8_0_on_load_is_the_dequantized_model(float_model, q8_model):
    # The reference: a float model whose weights are the Q8_0 blocks dequantized.
    deq = {name: (np.stack([np.asarray(m) for m in w]) if isinstance(w, list)
                  else np.asarray(w).T if name == "embed" else np.asarray(w))
           for name, w in quantize_weights({k: float_model.w[k] for k in
                                            pnp.models.llama.weight_shapes(CFG)}).items()}
    ref = pnp.LlamaModel(CFG, deq).dense_logits([1, 5, 7, 9])
    got = q8_model.dense_logits([1, 5, 7, 9])
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5 * np.abs(ref).max())
    assert q8_model.quantized and isinstance(q8_model.w["embed"], QuantMatrix)
    assert q8_model.num_parameters == float_model.num_parameters
    assert q8_model.nbytes < float_model.nbytes / 3


def test_engine_on_quantized_weights_equals_the_dense_check(q8_model):
    # Batches of 1, 2-16 and > 16 rows go through the three kernels.
    llm = pnp.LLM(q8_model, tokenizer=pnp.Tokenizer.tiny(), verbose=False)
    prompts = [[1 + i, 2, 3 + i, 4] * (1 + 5 * (i == 0)) for i in range(5)]
    params = pnp.SamplingParams(max_tokens=6, temperature=0)
    outs = llm.generate(prompts, params)
    for p, o in zip(prompts, outs):
        assert o.outputs[0].token_ids == q8_model.dense_generate(p, max_tokens=6)


def test_quantization_argument_is_checked():
    with pytest.raises(pnp.InvalidArgument, match="quantization"):
        pnp.load_model("smollm2-135m-instruct", quantization="q2_k")
    with pytest.raises(pnp.InvalidArgument, match="quantization"):
        pnp.LLM("smollm2-135m-instruct", quantization="int4")
    small = pnp.ModelConfig(vocab_size=96, hidden_size=48, num_layers=1, num_heads=2,
                            num_kv_heads=1, head_dim=24, intermediate_size=96)
    w = pnp.LlamaModel.random(small).w
    with pytest.raises(pnp.InvalidArgument, match="multiple of the 32"):
        quantize_weights({k: w[k] for k in pnp.models.llama.weight_shapes(small)})
    with pytest.raises(pnp.InvalidArgument, match="save"):
        pnp.LlamaModel(CFG, quantize_weights({k: pnp.LlamaModel.random(CFG).w[k] for k in
                                              pnp.models.llama.weight_shapes(CFG)})).save("x")


def test_real_file_stays_quantized_in_under_160_mib():
    model, _ = pnp.load_model("smollm2-135m-instruct")
    assert model.quantized and model.num_parameters == 134_515_008
    assert model.wqkv[0].fmt == "Q4_1" and model.w["embed"].fmt == "Q8_0"
    assert model.nbytes <= 160 * 2**20, model.nbytes / 2**20


def test_real_file_with_int8_activations_keeps_the_blocks_and_the_answer():
    # gguf_a8 holds the same blocks (same bytes, another layout) and answers close to gguf.
    model, tok = pnp.load_model("smollm2-135m-instruct", quantization="gguf_a8")
    ref, _ = pnp.load_model("smollm2-135m-instruct")
    assert model.wqkv[0].int8_activations and model.w["embed"].int8_activations
    assert model.num_parameters == ref.num_parameters
    assert abs(model.nbytes - ref.nbytes) < 0.05 * ref.nbytes
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}]))
    a, b = model.dense_logits(ids)[-1], ref.dense_logits(ids)[-1]
    assert int(np.argmax(a)) == int(np.argmax(b))
    assert 0 < np.abs(a - b).max() < 0.05 * np.abs(b).max()     # int8 inputs: close, not equal


def test_real_file_as_float32_still_equals_transformers():
    model, tok = pnp.load_model("smollm2-135m-instruct", quantization=None)
    assert not model.quantized and model.nbytes > 500 * 2**20
    rec = GOLDEN["records"][0]
    out = model.dense_generate(rec["prompt_ids"], GOLDEN["max_new_tokens"],
                               stop_token_ids=tok.stop_token_ids)
    assert out == rec["greedy_ids"]
