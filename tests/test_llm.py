"""pnp.LLM with the small random model and the tiny tokenizer: names, text, stop strings,
streaming, bad input, and the paged engine equal to the dense path."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import paged_np as pnp
from paged_np.checks import parse_bytes
from paged_np.engine.dense_check import check_against_dense


@pytest.fixture(scope="module")
def tok():
    return pnp.Tokenizer.tiny()


@pytest.fixture(scope="module")
def model(tok):
    return pnp.LlamaModel.random(pnp.ModelConfig(vocab_size=tok.vocab_size), seed=0)


def make_llm(model, tok, **kw):
    kw.setdefault("num_pages", 64)
    kw.setdefault("backend", "numpy")
    kw.setdefault("verbose", False)
    return pnp.LLM(model, tokenizer=tok, **kw)


GREEDY = pnp.SamplingParams(max_tokens=10, temperature=0)


class ScriptedModel(pnp.LlamaModel):
    """Answers every prompt of ``prompt_len`` tokens with ``script``, token after token."""

    def __init__(self, cfg, weights, script, prompt_len):
        super().__init__(cfg, weights)
        self.script, self.prompt_len = list(script), prompt_len

    def forward(self, batch, cache, backend="auto"):
        pos = batch.positions[batch.logits_indices]              # [S] last known position
        logits = np.zeros((len(pos), self.cfg.vocab_size), np.float32)
        for row, p in enumerate(pos.tolist()):
            logits[row, self.script[p + 1 - self.prompt_len]] = 1.0
        return logits


def scripted_llm(model, tok, answer: str, prompt: str, **kw):
    script = tok.encode(answer) + [tok.eos_token_id]
    scripted = ScriptedModel(model.cfg, {k: model.w[k] for k in
                                         pnp.models.llama.weight_shapes(model.cfg)},
                             script, len(tok.encode(prompt, add_special_tokens=True)))
    return make_llm(scripted, tok, **kw)


# ------------------------------------------------------------------ shapes and names
def test_generate_names_and_dense_equality(model, tok):
    llm = make_llm(model, tok)
    prompts = ["Hello world", "The paged cache keeps the keys"]
    outs = llm.generate(prompts, GREEDY)
    assert [o.prompt for o in outs] == prompts
    for o, p in zip(outs, prompts):
        assert o.prompt_token_ids == tok.encode(p, add_special_tokens=True)
        assert len(o.outputs) == 1 and o.finished
        c = o.outputs[0]
        ref = model.dense_generate(o.prompt_token_ids, 10, tok.stop_token_ids)
        assert c.token_ids == ref
        assert c.finish_reason == ("stop" if ref[-1] in tok.stop_token_ids else "length")
        # a trailing half character (random weights emit any byte) is held back
        assert c.text == tok.decode(c.token_ids).rstrip("\ufffd")
    assert llm.get_tokenizer() is tok and isinstance(llm.engine, pnp.Engine)


def test_generate_accepts_one_string_and_token_ids(model, tok):
    llm = make_llm(model, tok)
    one = llm.generate("Hello world", GREEDY)
    ids = tok.encode("Hello world")
    by_ids = llm.generate(ids, GREEDY)
    many = llm.generate([ids, ids[:3]], GREEDY)
    assert len(one) == 1 and len(by_ids) == 1 and len(many) == 2
    assert by_ids[0].prompt is None and by_ids[0].prompt_token_ids == ids
    assert by_ids[0].outputs[0].token_ids == one[0].outputs[0].token_ids
    assert many[1].outputs[0].token_ids == model.dense_generate(ids[:3], 10, tok.stop_token_ids)


def test_chat_renders_the_template(model, tok):
    llm = make_llm(model, tok)
    conv = [{"role": "user", "content": "What is the capital of France?"}]
    one = llm.chat(conv, GREEDY)
    two = llm.chat([conv, conv + [{"role": "assistant", "content": "Paris"},
                                  {"role": "user", "content": "And Spain?"}]], GREEDY)
    assert one[0].prompt == tok.apply_chat_template(conv) == two[0].prompt
    assert one[0].prompt_token_ids == tok.encode(one[0].prompt)
    assert one[0].outputs[0].token_ids == two[0].outputs[0].token_ids
    assert two[1].prompt.endswith("And Spain?<|im_end|>\n<|im_start|>assistant\n")
    # the second run of the same conversation reuses its full pages from the prefix cache
    assert two[0].num_cached_tokens == (len(two[0].prompt_token_ids) // 16) * 16 > 0


def test_n_samples_each_with_text(model, tok):
    llm = make_llm(model, tok)
    out = llm.generate("Hello", pnp.SamplingParams(n=3, max_tokens=6, temperature=1.0, seed=1))[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    for c in out.outputs:
        assert c.text == tok.decode(c.token_ids).rstrip("\ufffd")
        assert c.finish_reason in ("stop", "length")


def test_a_request_seed_reproduces_wherever_the_request_comes(model, tok):
    """vLLM's per-request seed: the same prompt and seed give the same sample alone,
    after other requests, or in a new LLM; the LLM's default seed keys by arrival."""
    seeded = pnp.SamplingParams(max_tokens=8, temperature=1.0, seed=5)
    alone = make_llm(model, tok).generate("Hello", seeded)[0].outputs[0].token_ids
    llm = make_llm(model, tok)
    llm.generate(["Hi", "Bye"], pnp.SamplingParams(max_tokens=3, temperature=1.0))
    later = llm.generate(["Bye", "Hello"], seeded)[1].outputs[0].token_ids
    assert later == alone
    unseeded = pnp.SamplingParams(max_tokens=8, temperature=1.0)
    twins = make_llm(model, tok).generate(["Hello", "Hello"], unseeded)
    assert twins[0].outputs[0].token_ids != twins[1].outputs[0].token_ids


# ------------------------------------------------------------------ stop strings
def test_stop_string_cuts_the_text(model, tok):
    prompt, answer = "Hi", "Hello world. The end of it."
    llm = scripted_llm(model, tok, answer, prompt)
    full = llm.generate(prompt, pnp.SamplingParams(max_tokens=40, temperature=0))[0].outputs[0]
    assert full.text == answer and full.finish_reason == "stop"
    assert full.stop_reason == tok.eos_token_id
    out = llm.generate(prompt, pnp.SamplingParams(max_tokens=40, temperature=0,
                                                  stop=["The end", "world"]))[0].outputs[0]
    assert out.text == "Hello " and out.finish_reason == "stop" and out.stop_reason == "world"
    # token ids run up to the token that completed the stop string, no further
    assert out.token_ids == full.token_ids[:len(out.token_ids)]
    assert "world" in tok.decode(out.token_ids) and "world" not in tok.decode(out.token_ids[:-1])
    assert llm.engine.cache.pool.num_in_use == 0                 # its pages went back
    llm.engine.step()                                          # hands back the stopped one
    assert not llm.engine.has_unfinished_requests()


def test_stop_string_never_streamed(model, tok):
    prompt, answer = "Hi", "abc STOP def"
    llm = scripted_llm(model, tok, answer, prompt)
    llm.add_request("r", prompt, pnp.SamplingParams(max_tokens=40, temperature=0, stop="STOP"))
    seen = []
    while llm.has_unfinished_requests():
        seen += [o.outputs[0].text for o in llm.step()]
    assert seen[-1] == "abc "
    assert all("S" not in t for t in seen)                      # held back, then cut


@pytest.mark.parametrize("answer", ["café 🙂 日本語", "🙂🙂 x ü", "naïve — ok"])
def test_streaming_never_splits_a_character(model, tok, answer):
    prompt = "Hi"
    llm = scripted_llm(model, tok, answer, prompt)
    llm.add_request(7, prompt, pnp.SamplingParams(max_tokens=60, temperature=0))
    texts, ids = [], []
    while llm.has_unfinished_requests():
        for o in llm.step():
            texts.append(o.outputs[0].text)
            ids.append(len(o.outputs[0].token_ids))
    assert ids == sorted(ids) and len(ids) == len(tok.encode(answer)) + 1
    assert texts[-1] == answer
    assert all("\ufffd" not in t and answer.startswith(t) for t in texts)
    assert any(len(a) == len(b) for a, b in zip(texts, texts[1:]))   # bytes were held back


# ------------------------------------------------------------------ step by step
def test_step_api_and_abort(model, tok):
    llm = make_llm(model, tok)
    llm.add_request("a", "Hello world", pnp.SamplingParams(max_tokens=8, temperature=0))
    llm.add_request("b", [5, 6, 7, 8], pnp.SamplingParams(max_tokens=50, temperature=0,
                                                          ignore_eos=True))
    first = llm.step()
    assert {o.request_id for o in first} == {"a", "b"}
    assert all(len(o.outputs[0].token_ids) == 1 for o in first)
    llm.abort("b")
    with pytest.raises(pnp.UnknownRequest, match="'b'"):
        llm.abort("b")
    done = []
    while llm.has_unfinished_requests():
        done += [o for o in llm.step() if o.finished]
    assert [o.request_id for o in done] == ["a"]
    assert done[0].outputs[0].token_ids == model.dense_generate(
        tok.encode("Hello world"), 8, tok.stop_token_ids)
    llm.engine.step()                                          # hands back the aborted one
    assert llm.engine.cache.pool.num_in_use == 0


def test_max_tokens_clipped_to_max_model_len(model, tok):
    llm = make_llm(model, tok, num_pages=2, page_size=8)       # 16 tokens in all
    assert llm.max_model_len == 16
    out = llm.generate([1, 2, 3, 4, 5, 6], pnp.SamplingParams(max_tokens=100, temperature=0,
                                                              ignore_eos=True))[0]
    assert len(out.outputs[0].token_ids) == 10 and out.outputs[0].finish_reason == "length"


# ------------------------------------------------------------------ bad input
def test_bad_requests_name_the_argument_and_change_nothing(model, tok):
    llm = make_llm(model, tok)
    cases = [
        (("r", "", None), pnp.InvalidArgument, "prompt"),
        (("r", [], None), pnp.InvalidArgument, "prompt"),
        (("r", [1, 10**6], None), pnp.InvalidArgument, "prompt"),
        (("r", [1, 2.5], None), pnp.InvalidArgument, "prompt"),
        (("r", 3.0, None), pnp.DTypeError, "prompt"),
        (("r", "hi", "greedy"), pnp.DTypeError, "sampling_params"),
        ((None, "hi", None), pnp.DTypeError, "request_id"),
        (("r", list(range(1, 70)) * 20, None), pnp.InvalidArgument, "max_model_len"),
    ]
    for args, err, word in cases:
        with pytest.raises(err, match=word):
            llm.add_request(*args)
    assert not llm.has_unfinished_requests() and not llm.engine.has_unfinished_requests()
    llm.add_request("r", "hi", GREEDY)
    with pytest.raises(pnp.InvalidArgument, match="request_id"):
        llm.add_request("r", "hi", GREEDY)
    with pytest.raises(pnp.InvalidArgument, match="add_request"):
        llm.generate("hi", GREEDY)
    llm.abort("r")
    with pytest.raises(pnp.InvalidArgument, match="sampling_params"):
        llm.generate(["a", "b"], [GREEDY])
    with pytest.raises(pnp.InvalidArgument, match="prompt"):   # one bad prompt: none queued
        llm.generate(["fine", ""], GREEDY)
    assert [o.request_id for o in llm.engine.step()] == ["r"]   # the aborted one, only
    assert not llm.engine.has_unfinished_requests()
    with pytest.raises(pnp.InvalidArgument, match="messages"):
        llm.chat("hello")
    with pytest.raises(pnp.PagedNPError, match="stop"):
        pnp.SamplingParams(stop=[""])
    with pytest.raises(pnp.DTypeError, match="stop"):
        pnp.SamplingParams(stop=[3])


def test_bad_constructor_arguments(model, tok):
    with pytest.raises(pnp.InvalidArgument, match="kv_cache_memory or num_pages"):
        pnp.LLM(model, tokenizer=tok, kv_cache_memory="1MiB", num_pages=4, verbose=False)
    with pytest.raises(pnp.InvalidArgument, match="tokenizer"):
        pnp.LLM(model, verbose=False)
    with pytest.raises(pnp.InvalidArgument, match="kv_cache_memory"):
        pnp.LLM(model, tokenizer=tok, kv_cache_memory="12 parsecs", verbose=False)
    with pytest.raises(pnp.InvalidArgument, match="kv_cache_memory"):
        pnp.LLM(model, tokenizer=tok, kv_cache_memory=10, verbose=False)
    with pytest.raises(pnp.DTypeError, match="model"):
        pnp.LLM(3.5, verbose=False)
    assert parse_bytes("256MiB") == 256 * 2**20 and parse_bytes("1.5GB") == 1_500_000_000
    assert parse_bytes(4096) == 4096


def test_arena_sized_from_memory(model, tok, capsys):
    llm = pnp.LLM(model, tokenizer=tok, kv_cache_memory="1MiB", page_size=16)
    cfg = model.cfg
    per_page = 2 * cfg.num_layers * cfg.num_kv_heads * 16 * cfg.head_dim * 4
    assert llm.engine.cache.cfg.num_pages == 2**20 // per_page
    assert f"{2**20 // per_page} pages" in capsys.readouterr().out


# ------------------------------------------------------------------ paged == dense
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_and_prefix_hits_equal_dense(model, tok, mode):
    system = "The paged cache keeps the keys and values of every token in fixed-size pages. "
    questions = ["What is a block table?", "Hello!", "What is the capital of France?",
                 "How are you today?", "Why share pages?", "And the answer is?"]
    convs = [[{"role": "system", "content": system}, {"role": "user", "content": q}]
             for q in questions]
    llm = make_llm(model, tok, num_pages=14, page_size=8, max_num_seqs=6,
                   max_num_batched_tokens=64, preemption_mode=mode)
    params = pnp.SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    outs = llm.chat(convs, params)
    m = llm.engine.metrics
    assert m["preemptions"] > 0
    assert sum(o.num_cached_tokens for o in outs) > 0
    for o in outs:       # teacher-forced: one dense forward over prompt + output
        check = check_against_dense(model, o.prompt_token_ids, o.outputs[0].token_ids)
        assert check.ok and check.checked == 24 and check.near_tie is None


def test_check_against_dense_finds_a_wrong_token(model, tok):
    prompt = tok.encode("Hello world")
    good = model.dense_generate(prompt, 6)
    assert check_against_dense(model, prompt, good).checked == 6
    bad = good[:3] + [(good[3] + 1) % model.cfg.vocab_size] + good[4:]
    check = check_against_dense(model, prompt, bad)
    assert not check.ok and check.mismatch == 3 and check.checked == 3


# ------------------------------------------------------------------ every engine option
#: A valid, non-default value of every EngineConfig field: a field added to the
#: config without a line here fails test_llm_accepts_every_engine_option.
OPTION_VALUES = {
    "num_pages": 48, "kv_cache_memory": "1MiB", "page_size": 8, "kv_cache_dtype": "int8",
    "kv_layout": "k_transposed", "max_num_seqs": 5,
    "max_num_batched_tokens": 96, "preemption_mode": "swap", "swap_pages": 7,
    "schedule": "lpm", "prefix_cache": "radix", "eviction_policy": "fifo",
    "backend": "numba", "record_events": True, "sliding_window": 64, "attention_sinks": 4,
    "speculative_config": pnp.SpeculativeConfig(num_speculative_tokens=3),
    "kv_cache": "paged", "scheduler": "vllm", "sampler": "vllm", "engine_step": "vllm",
    "host_cache_memory": "1MiB", "disk_cache_dir": "<tmp_path>", "disk_cache_memory": "8MiB",
    "disk_write_policy": "write_back", "tier_eviction_policy": "lfu", "tier_reuse_gate": 1,
}


@pytest.mark.parametrize("name", [f.name for f in dataclasses.fields(pnp.EngineConfig)])
def test_llm_accepts_every_engine_option(model, tok, name, tmp_path):
    assert name in OPTION_VALUES, f"no test value for the new EngineConfig field {name!r}"
    value = OPTION_VALUES[name]
    value = str(tmp_path) if value == "<tmp_path>" else value     # the disk tier's files
    size = {} if name in ("num_pages", "kv_cache_memory") else {"num_pages": 32}
    llm = pnp.LLM(model, tokenizer=tok, verbose=False, **size, **{name: value})
    assert getattr(llm.engine.config, name) == value
    assert llm.engine.config.max_num_seqs == (value if name == "max_num_seqs" else 16)


def test_llm_takes_a_config_and_options_replace_its_fields(model, tok):
    cfg = pnp.EngineConfig(num_pages=24, schedule="lpm", max_num_seqs=3)
    llm = pnp.LLM(model, tokenizer=tok, config=cfg, prefix_cache="radix", verbose=False)
    c = llm.engine.config
    assert (c.num_pages, c.schedule, c.prefix_cache, c.max_num_seqs) == (24, "lpm", "radix", 3)
    assert llm.engine.cache.cfg.prefix_cache == "radix"
    with pytest.raises(pnp.InvalidArgument, match="unknown engine option"):
        pnp.LLM(model, tokenizer=tok, prefix_caching=True, verbose=False)


def test_greedy_text_unchanged_by_radix_lpm_and_swap(model, tok):
    """The redesign's promise: the cache-aware options change speed, never the text."""
    system = "The paged cache keeps the keys and values of every token in fixed-size pages. "
    questions = ["What is a block table?", "Hello!", "What is the capital of France?",
                 "How are you today?", "Why share pages?", "And the answer is?"]
    convs = [[{"role": "system", "content": system}, {"role": "user", "content": q}]
             for q in questions]
    params = pnp.SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    small = dict(num_pages=14, page_size=8, max_num_seqs=6, max_num_batched_tokens=64)
    want = [o.outputs[0].text for o in make_llm(model, tok).chat(convs, params)]
    for opts in (dict(prefix_cache="radix"), dict(schedule="lpm"),
                 dict(preemption_mode="swap"),
                 dict(prefix_cache="radix", schedule="lpm", preemption_mode="swap")):
        llm = make_llm(model, tok, **small, **opts)
        got = [o.outputs[0].text for o in llm.chat(convs, params)]
        assert got == want, opts
        m = llm.engine.metrics
        assert m["preemptions"] > 0 and m["prefix_hit_tokens"] > 0, opts
        if opts.get("preemption_mode") == "swap":
            assert m["swapped_out"] > 0, opts
