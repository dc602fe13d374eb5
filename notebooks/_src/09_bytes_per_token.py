# %% [markdown]
# # 9. Bytes per token
#
# To decode one token, a model multiplies one vector by every weight matrix it has.
# Each weight is read from memory once and used for one multiply-add: 2 flops per
# weight read. A CPU core does tens of flops in the time it takes to read one float
# from memory, a GPU hundreds (an H100's dense bf16: about 300 per byte), so decode at
# batch 1 waits on memory, not on arithmetic, and its speed limit is
#
# `tokens/s <= read bandwidth (bytes/s) / weight bytes read per token`.
#
# The only way past it is to read fewer bytes. SmolLM2-135M's GGUF file stores its
# projections as **Q4_1** (4 bits a weight, plus a scale and a minimum per 32 weights) and
# its embedding as **Q8_0** (8 bits, one scale per 32): about 96 MB instead of 513 MiB of
# float32. This notebook opens one block of that file byte by byte, measures the error
# each format makes on real weights, and times decode against the bound.
#
# **What you need:** notebook 6 (arithmetic intensity, the roofline's bandwidth roof) and
# notebook 8 (SmolLM2 through `pnp.LLM`); bits and bytes in NumPy (`view`, `&`, `>>`).
# The model file (98 MB) is fetched once if notebook 8 has not fetched it.
#
# **What you will be able to do:** bound batch-1 decode speed by bytes over bandwidth;
# read a Q4_1 block byte by byte and dequantize it by hand, checked against the package;
# say what the scales and minimums cost in bits per weight and what each format's
# rounding costs in error; explain why a quantized kernel can stop short of its bound.

# %%
import time

import gguf
import matplotlib.pyplot as plt
import numpy as np

import paged_np as pnp
from paged_np.hardware import stream_bandwidth
from paged_np.models.hub import fetch_model
from paged_np.quant import QuantMatrix, dequantize_blocks, parse_blocks
from _exercise import check              # notebooks/_exercise.py: checks your answers

path = fetch_model("smollm2-135m-instruct")
quant, tok = pnp.load_model(path)                        # quantization="gguf", the default
print(f"quantized model: {quant.nbytes / 2**20:.0f} MiB in memory, "
      f"float32 would be {4 * quant.num_parameters / 2**20:.0f} MiB")

# %% [markdown]
# ## 1. One Q4_1 block, byte by byte
#
# A Q4_1 block is 20 bytes for 32 weights: a float16 scale `d`, a float16 minimum `m`,
# then 16 bytes of 4-bit values `q` (0..15). Byte `j` holds weight `j` in its low four
# bits and weight `j + 16` in its high four bits. The weight is `w = d * q + m`.

# %%
reader = gguf.GGUFReader(str(path), "r")
tensor = next(t for t in reader.tensors if t.name == "blk.0.ffn_down.weight")
print(tensor.name, tensor.tensor_type.name, "rows x cols:", tuple(reversed(tensor.shape)))
block = np.array(tensor.data[0, :20], dtype=np.uint8)    # row 0, block 0: 20 bytes
print(" ".join(f"{b:02x}" for b in block))

# %%
fig, ax = plt.subplots(figsize=(10, 1.6))
colors = ["tab:red"] * 2 + ["tab:orange"] * 2 + ["tab:blue"] * 16
ax.bar(range(20), np.ones(20), color=colors, edgecolor="white")
for i, b in enumerate(block):
    ax.text(i, 0.5, f"{b:02x}", ha="center", va="center", color="white", fontsize=9)
ax.set_xticks([0.5, 2.5, 11.5], ["d (float16)", "m (float16)",
                                  "16 bytes: low nibble = q[j], high nibble = q[j+16]"])
ax.set_yticks([])
ax.set_title("one Q4_1 block: 20 bytes, 32 weights (5 bits a weight)")
plt.show()

# %% [markdown]
# ## Exercise 9a: dequantize the block by hand
#
# From the 20 bytes in `block`, compute the 32 weights as float32. Hints: `block[0:2]`
# viewed as `np.float16` is `d`; the low nibble of a byte is `b & 0x0F`, the high one
# `b >> 4`; weights 0-15 come from the low nibbles, 16-31 from the high ones.

# %% exercise 9a
weights = None   # float32 [32]: the block's weights, w = d * q + m

# %% check 9a
_q, _d, _m = parse_blocks(tensor.data, "Q4_1", *reversed([int(n) for n in tensor.shape]))
check("9a", dict(weights=weights), dict(weights=dequantize_blocks(_q, _d, _m)[0, :32]),
      hints="d = block[0:2].view(np.float16)[0]; q = np.concatenate([lo, hi]); "
            "w = d * q + m, in float32.",
      done="paged_np.quant.parse_blocks does the same for every block of a tensor.")

# %% [markdown]
# ## 2. The error each format makes
#
# The file's embedding is Q8_0; dequantized, it is a float32 matrix of real weights.
# Quantize it again to each format (llama.cpp's own quantizer, `gguf.quants`) and
# compare. Bits per weight count the scales: Q8_0 is 34 bytes per 32 weights, Q4_0 18,
# Q4_1 20.

# %%
emb = np.asarray(quant.w["embed"]).T[:4096]              # [4096, 576] real weights, float32
rows = []
for fmt, bits in (("Q8_0", 8.5), ("Q4_1", 5.0), ("Q4_0", 4.5)):
    qt = gguf.GGMLQuantizationType[fmt]
    back = gguf.quants.dequantize(gguf.quants.quantize(emb, qt), qt)
    err = np.sqrt(np.mean((back - emb) ** 2)) / np.sqrt(np.mean(emb ** 2))
    rows.append((fmt, bits, err))
    print(f"{fmt}: {bits} bits/weight, relative RMS error {100 * err:.2f}%")
assert rows[0][2] < rows[1][2] < rows[2][2]             # fewer bits, more error

# %% [markdown]
# Q4_1 has one more float16 per block than Q4_0 (the minimum), so its 16 levels
# span the block's real range instead of a range symmetric around zero: less error for
# half a bit more. The golden tests check that the Q4_1 model's greedy tokens still equal
# transformers' (which dequantizes the same blocks).
#
# ## 3. Decode time against the bound, per format
#
# One pass of the 30 layers' fused gate/up matrices (`[576, 3072]` each) at batch 1,
# held three ways: float32 (BLAS), Q8_0 and Q4_1 (`paged_np.quant`'s Numba kernels, which
# run their SIMD lanes across 64 output rows so each block's scale is applied once). The
# bound is the bytes read over the read bandwidth measured here.

# %%
mats = {"Q4_1": quant.w_gate_up}
mats["float32"] = [np.asarray(m) for m in mats["Q4_1"]]            # [576, 3072] each
mats["Q8_0"] = [QuantMatrix.from_float(m) for m in mats["float32"]]
x = np.random.default_rng(0).standard_normal((1, 576), dtype=np.float32)
bw = stream_bandwidth(3) * 1e9                                       # bytes/s


def pass_time(ms, repeat=5):
    best = np.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        for m in ms:
            x @ m
        best = min(best, time.perf_counter() - t0)
    return best


result = {}
for fmt, ms in mats.items():
    pass_time(ms, 1)                                                 # compile, warm up
    nbytes = sum(m.nbytes for m in ms)
    result[fmt] = (nbytes, pass_time(ms))
    print(f"{fmt:>7}: {nbytes / 2**20:5.1f} MiB, {1e3 * result[fmt][1]:.2f} ms "
          f"(bound {1e3 * nbytes / bw:.2f} ms at {bw / 1e9:.1f} GB/s)")

# %%
fig, ax = plt.subplots(figsize=(6, 3))
names = list(result)
ax.bar(names, [1e3 * t for _, t in result.values()], color="tab:blue", label="measured")
ax.scatter(names, [1e3 * b / bw for b, _ in result.values()], color="tab:red", zorder=3,
           label="bytes / bandwidth")
ax.set_ylabel("ms per pass")
ax.legend()
ax.set_title("fewer bytes, less time: 30 gate/up matrices at batch 1")
plt.show()

# %% [markdown]
# On the project's 2-core machine the Q4_1 pass is several times faster than float32:
# the kernels read 0.75 bytes a weight (the 4-bit values plus float32 scales) instead of
# 4. Whether a kernel reaches its bound depends on the arithmetic per byte it does:
# Q4_1 unpacks two weights per byte and converts them to floats, work that float32 BLAS
# never does. `python -m paged_np bench --model smollm2-135m-instruct` measures the whole
# decode step against llama.cpp on the same file (`benchmarks/model_quant.md`).
#
# ## Self-check
#
# 1. A model has 135 M weights. At batch 1, how many tokens per second can a machine with
#    20 GB/s of read bandwidth decode in float32, and in Q4_1 (5 bits a weight)?
#    <details><summary>answer</summary>At most 20e9 / (135e6 x 4) = 37 in float32 and
#    20e9 / (135e6 x 5 / 8) = 237 in Q4_1: each token reads every weight once.</details>
# 2. Why does a larger batch not help this bound the same way a smaller format does?
#    <details><summary>answer</summary>It does help, differently: a batch of B reads the
#    weights once for B tokens, so tokens per second rise until the arithmetic or the
#    KV reads limit it. A smaller format helps batch 1 too, where no batch exists to share
#    the read.</details>
# 3. A Q4_1 block's scale is 0.01 and its minimum -0.07. Which weight does a nibble of
#    0x9 stand for?
#    <details><summary>answer</summary>w = d x q + m = 0.01 x 9 - 0.07 = 0.02.</details>
# 4. Q4_0 has 4.5 bits a weight and Q4_1 5. What does the extra half bit buy?
#    <details><summary>answer</summary>A minimum per block, so the 16 levels span the
#    block's own range rather than one symmetric around zero: less error on blocks that
#    are not centred on zero.</details>
#
# **Next:** notebook 10 quantizes the other big reader of memory, the KV pages.
