"""LlamaModel: a Llama-style decoder in NumPy, run over a paged KV cache.

The model is the part of a server that the cache exists for. Each layer is
the Llama recipe::

    h = x + Attention(RMSNorm(x))        # RoPE on q and k, GQA, causal
    x = h + MLP(RMSNorm(h))              # SwiGLU: down(silu(gate(h)) * up(h))
    logits = RMSNorm(x) @ lm_head        # only at the tokens that need one

Two ways to run it:

- :meth:`LlamaModel.forward` runs **one engine step**: every scheduled token of
  every sequence at once, in the *varlen* layout that vLLM and FlashInfer use.
  The tokens of all sequences are concatenated into one ``[T]`` array and
  ``query_start_loc`` (int32 ``[B+1]``) says where each sequence's tokens
  start. All the dense math (projections, RoPE, MLP) is a handful of matmuls
  over ``[T, ...]`` arrays: sequences only matter to attention, which reads
  each sequence's history from the cache pages through its block table. Each
  layer first *writes* this step's K and V into their slots, then attends
  (so a token sees itself). There is no Python loop over sequences here.
- :meth:`LlamaModel.dense_generate` is the truth the engine is checked
  against: greedy decoding that recomputes the whole sequence at every step
  with dense attention (:mod:`paged_np.attention.reference`) and no cache at
  all. Slow and obviously right.

Everything computes in float32, and both paths share every function except
attention, so greedy tokens from the engine equal ``dense_generate`` token
for token (the weights of :meth:`LlamaModel.random` spread the logits so that
float32 rounding does not flip an argmax).

The same class runs a real checkpoint: :func:`paged_np.load_model` reads
SmolLM2-135M-Instruct (GGUF or a Hugging Face directory) into a
:class:`~paged_np.ModelConfig` and a dict of weights, and the model never
knows where they came from. The weights are float32 arrays, or (a GGUF
file's default, ``quantization="gguf"``) :class:`~paged_np.quant.QuantMatrix`
objects holding the file's quantized blocks: ``x @ w`` reads the same either
way, so every method below serves both (:mod:`paged_np.models.quantized`).

Weights are stored the way a batch-1 decode wants to stream them: ``[in, out]``
row-major float32, with q, k and v fused into one ``[H, q+2kv]`` matrix and
gate and up into one ``[H, 2I]``, so each layer reads 4 matrices with 4
matrix-vector products instead of 7. ``model.w`` still shows the separate
weights (``wq``, ``w_gate``, ...) as views into the fused arrays. With tied
embeddings the LM head is a transposed *view* of the embedding (no copy).

Compared with a real Llama server: no rope scaling, no bias terms, float32
activations (quantized weights are multiplied block by block, never the
activations quantized).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass

import numpy as np

from ..attention import AttentionMetadata, paged_attention
from ..attention.reference import dense_attention
from ..checks import as_token_ids, check_positive_int
from ..config import ModelConfig
from ..errors import DTypeError, InvalidArgument, ShapeError

# Weight names, their shapes as functions of the config, and whether they are
# stacked over layers (a leading [num_layers] axis).
_LAYER_WEIGHTS = ("attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w_gate", "w_up", "w_down")


def weight_shapes(cfg: ModelConfig) -> dict:
    """Our weight names and shapes; projections are ``[in, out]`` (``y = x @ w``)."""
    H, L, D = cfg.hidden_size, cfg.num_layers, cfg.head_dim
    q_dim, kv_dim, inter = cfg.num_heads * D, cfg.num_kv_heads * D, cfg.intermediate_size
    shapes = {
        "embed": (cfg.vocab_size, H),
        "attn_norm": (L, H), "wq": (L, H, q_dim), "wk": (L, H, kv_dim), "wv": (L, H, kv_dim),
        "wo": (L, q_dim, H),
        "mlp_norm": (L, H), "w_gate": (L, H, inter), "w_up": (L, H, inter),
        "w_down": (L, inter, H),
        "final_norm": (H,), "lm_head": (H, cfg.vocab_size),
    }
    if cfg.tie_word_embeddings:
        del shapes["lm_head"]                                    # it is embed.T
    return shapes


@dataclass
class ForwardBatch:
    """The inputs of one engine step, varlen layout (``T`` tokens, ``B`` sequences).

    token_ids, positions : int64 ``[T]``: every scheduled token and its position
    slots : int64 ``[T]``: where each token's K/V goes in the arena
    query_start_loc : int32 ``[B+1]``: sequence ``b`` owns tokens ``[qsl[b], qsl[b+1])``
    block_tables : int32 ``[B, max_pages]`` and seq_lens : int32 ``[B]``, from
        ``cache.batch(seq_ids)`` (seq_lens include this step's tokens)
    logits_indices : int64 ``[S]``: the tokens whose next-token logits are wanted
        (the last token of each sequence that will sample)
    sliding_window, attention_sinks : the attention's mask, the engine's options
        (``sliding_window`` None: the model's own; sinks need a window)
    """

    token_ids: np.ndarray
    positions: np.ndarray
    slots: np.ndarray
    query_start_loc: np.ndarray
    block_tables: np.ndarray
    seq_lens: np.ndarray
    logits_indices: np.ndarray
    sliding_window: int | None = None
    attention_sinks: int = 0


class LlamaModel:
    """A Llama-style decoder with NumPy weights (float32).

    ``weights`` maps the names of :func:`weight_shapes` to arrays
    (projections ``[in, out]``); with ``cfg.tie_word_embeddings`` there is no
    ``lm_head``. The arrays are copied into the fused layout (see the module
    docstring), so the caller may free its own.

    Example
    -------
    >>> import paged_np as pnp
    >>> model = pnp.LlamaModel.random(pnp.ModelConfig(), seed=0)
    >>> len(model.dense_generate([1, 2, 3], max_tokens=4))
    4
    """

    def __init__(self, cfg: ModelConfig, weights: dict):
        if not isinstance(cfg, ModelConfig):
            raise DTypeError(f"cfg must be a ModelConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        shapes = weight_shapes(cfg)
        missing = sorted(set(shapes) - set(weights))
        if missing:
            raise InvalidArgument(f"weights: missing {missing}")
        q_dim = cfg.num_heads * cfg.head_dim
        kv_dim = cfg.num_kv_heads * cfg.head_dim
        inter = cfg.intermediate_size
        # Quantized weights are QuantMatrix objects: they exist only if their plug-in
        # (paged_np.models.quantized) was imported, so a float model never imports it.
        quantized = sys.modules.get("paged_np.models.quantized")
        self.quantized = quantized is not None and quantized.is_quantized(weights)
        if self.quantized:
            self._init_quantized(shapes, weights)
        else:
            self._init_float(shapes, weights, q_dim, kv_dim, inter)
        self._q_dim, self._kv_dim, self._inter = q_dim, kv_dim, inter
        # RoPE frequencies, one per pair of dims: theta^(-2i/D), i < D/2.
        half = cfg.head_dim // 2
        self._inv_freq = cfg.rope_theta ** (-np.arange(half, dtype=np.float64) / half)  # [D/2]

    def _init_float(self, shapes, weights, q_dim, kv_dim, inter):
        cfg = self.cfg
        for name, shape in shapes.items():
            if np.shape(weights[name]) != shape:
                raise ShapeError(f"weights[{name!r}] must have shape {shape}, "
                                 f"got {np.shape(weights[name])}")
        f32 = {name: np.asarray(weights[name], dtype=np.float32) for name in shapes}
        # Fused storage: one matrix-vector product per group instead of three (or two).
        self.wqkv = np.concatenate([f32["wq"], f32["wk"], f32["wv"]], axis=2)  # [L, H, q+2kv]
        self.w_gate_up = np.concatenate([f32["w_gate"], f32["w_up"]], axis=2)  # [L, H, 2I]
        self.w = {name: np.ascontiguousarray(f32[name]) for name in
                  ("embed", "attn_norm", "wo", "mlp_norm", "w_down", "final_norm")}
        self.w["wq"] = self.wqkv[:, :, :q_dim]                   # views, for reading only
        self.w["wk"] = self.wqkv[:, :, q_dim:q_dim + kv_dim]
        self.w["wv"] = self.wqkv[:, :, q_dim + kv_dim:]
        self.w["w_gate"] = self.w_gate_up[:, :, :inter]
        self.w["w_up"] = self.w_gate_up[:, :, inter:]
        # Tied: the LM head is the embedding read sideways, [H, V], a view (BLAS
        # multiplies by a transposed matrix without copying it).
        self.w["lm_head"] = (self.w["embed"].T if cfg.tie_word_embeddings
                             else np.ascontiguousarray(f32["lm_head"]))

    def _init_quantized(self, shapes, weights):
        """QuantMatrix weights (:mod:`paged_np.models.quantized`): fused per layer; the
        separate ``wq`` ... ``w_up`` are not kept (the fused ones hold the same blocks)."""
        from .quantized import check_quantized, fuse

        check_quantized(shapes, weights)
        self.wqkv = fuse(weights["wq"], weights["wk"], weights["wv"])   # L x [H, q+2kv]
        self.w_gate_up = fuse(weights["w_gate"], weights["w_up"])       # L x [H, 2I]
        self.w = {name: weights[name] for name in ("embed", "wo", "w_down")}
        for name in ("attn_norm", "mlp_norm", "final_norm"):
            self.w[name] = np.ascontiguousarray(weights[name], dtype=np.float32)
        # The embedding QuantMatrix is [H, V] read as a matrix: the tied LM head itself.
        self.w["lm_head"] = weights["embed" if self.cfg.tie_word_embeddings else "lm_head"]

    # ------------------------------------------------------------ weights I/O
    def _matrices(self) -> dict:
        """Every distinct weight array or QuantMatrix, by name (the tied head once)."""
        tied = self.cfg.tie_word_embeddings
        if not self.quantized:
            return {k: a for k, a in self.w.items() if not (k == "lm_head" and tied)}
        mats = {k: a for k, a in self.w.items() if not (k == "lm_head" and tied)}
        mats.update(wqkv=self.wqkv, w_gate_up=self.w_gate_up)
        return mats

    @property
    def num_parameters(self) -> int:
        """Parameters (the tied LM head counted once)."""
        return sum(sum(m.size for m in a) if isinstance(a, list) else a.size
                   for a in self._matrices().values())

    @property
    def nbytes(self) -> int:
        """Bytes of weight memory this model holds (quantized blocks and scales, or float32)."""
        if not self.quantized:
            return 4 * self.num_parameters
        from .quantized import weight_bytes

        return weight_bytes(self._matrices(), tied=False)

    @classmethod
    def random(cls, cfg: ModelConfig, seed: int = 0) -> LlamaModel:
        """Seeded random weights, scaled so activations keep unit size.

        Projections are ``N(0, 1/fan_in)``; the LM head is drawn 4x larger so
        that the logits are well separated (argmax stable under float32
        rounding, sampling at temperature 1 not uniform).
        """
        if not isinstance(cfg, ModelConfig):
            raise DTypeError(f"cfg must be a ModelConfig, got {type(cfg).__name__}")
        rng = np.random.default_rng(seed)
        weights = {}
        for name, shape in weight_shapes(cfg).items():
            if name.endswith("norm"):
                weights[name] = np.ones(shape, dtype=np.float32)
                continue
            fan_in = shape[-2]
            std = 1.0 if name == "embed" else 1.0 / np.sqrt(fan_in)
            if name == "lm_head":
                std *= 4.0
            weights[name] = (rng.standard_normal(shape) * std).astype(np.float32)
        return cls(cfg, weights)

    def save(self, path) -> None:
        """Write the weights and the config to one ``.npz`` file (float32 models only)."""
        if self.quantized:
            raise InvalidArgument("save: this model holds quantized weights; load it with "
                                  "quantization=None to save float32 weights")
        names = weight_shapes(self.cfg)
        np.savez(path, __config__=np.array(json.dumps(asdict(self.cfg))),
                 **{k: self.w[k] for k in names})

    @classmethod
    def load(cls, path) -> LlamaModel:
        """Read a model written by :meth:`save`."""
        with np.load(path, allow_pickle=False) as f:
            cfg = ModelConfig(**json.loads(str(f["__config__"])))
            weights = {k: f[k] for k in f.files if k != "__config__"}
        return cls(cfg, weights)

    # ---------------------------------------------------------- shared pieces
    def embed(self, token_ids: np.ndarray) -> np.ndarray:
        """int ``[T]`` -> float32 ``[T, hidden]``."""
        if token_ids.size and int(token_ids.max()) >= self.cfg.vocab_size:
            raise InvalidArgument(f"token_ids: id {int(token_ids.max())} is outside the "
                                  f"vocabulary [0, {self.cfg.vocab_size})")
        return self.w["embed"][token_ids]                        # [T, H]

    def ops(self, backend: str = "auto"):
        """The per-layer operations (``rms_norm``, ``rope_qk``, ``silu_mul``): plain
        NumPy (:class:`NumpyOps`) with the numpy backend, else each fused into one
        Numba call (:mod:`.fused`, loaded when first used)."""
        if backend == "numpy" and not self.quantized:
            return NumpyOps
        from . import fused

        return fused

    def qkv(self, layer: int, x: np.ndarray, rope, ops=None):
        """``x`` [T, H] -> q [T, Hq, D], k and v [T, Hkv, D], RoPE applied.

        ``rope`` is ``self.rope(positions)``: the same for every layer, so the
        forward computes it once per step. ``ops``: see :meth:`ops`.
        """
        cfg, w, fused = self.cfg, self.w, ops or self.ops()
        h = fused.rms_norm(x, w["attn_norm"][layer], cfg.rms_norm_eps)  # [T, H]
        qkv = h @ self.wqkv[layer]                               # [T, q+2kv], one product
        cos, sin = rope                                          # [T, D/2] each
        # q [T, Hq, D] and k [T, Hkv, D] rotated (apply_rope's arithmetic, one call), v a view.
        return fused.rope_qk(qkv, cos, sin, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)

    def rope(self, positions: np.ndarray):
        """cos and sin of each position's angles, float32 ``[T, D/2]``."""
        angles = positions[:, None].astype(np.float64) * self._inv_freq[None, :]  # [T, D/2]
        return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)

    def finish_layer(self, layer: int, x: np.ndarray, attn: np.ndarray, ops=None) -> np.ndarray:
        """Output projection, residual, then the SwiGLU MLP block: [T, H] -> [T, H]."""
        cfg, w, fused = self.cfg, self.w, ops or self.ops()
        T = x.shape[0]
        x = x + attn.reshape(T, -1) @ w["wo"][layer]             # [T, H]
        h = fused.rms_norm(x, w["mlp_norm"][layer], cfg.rms_norm_eps)  # [T, H]
        gate_up = h @ self.w_gate_up[layer]                      # [T, 2I], one product
        # silu(gate) * up, gate and up the two halves of gate_up: [T, I], one call.
        return x + fused.silu_mul(gate_up, self._inter) @ w["w_down"][layer]  # [T, H]

    def logits(self, x: np.ndarray, ops=None) -> np.ndarray:
        """Final norm and LM head: [S, H] -> float32 [S, vocab]."""
        h = (ops or self.ops()).rms_norm(x, self.w["final_norm"], self.cfg.rms_norm_eps)  # [S, H]
        if self.cfg.tie_word_embeddings and not self.quantized:
            # embed [V, H] is row-major: embed @ h.T streams it row by row, which BLAS
            # does 1.5x faster than h @ embed.T (measured at batch 1, 113 MiB).
            return np.ascontiguousarray((self.w["embed"] @ h.T).T)  # [S, V]
        return h @ self.w["lm_head"]                             # [S, V]

    # ----------------------------------------------------------- paged path
    def forward(self, batch: ForwardBatch, cache, backend: str = "auto") -> np.ndarray:
        """One engine step over a varlen batch; returns float32 ``[S, vocab]`` logits.

        ``cache`` is the :class:`~paged_np.PagedKVCache` whose slots and block
        tables ``batch`` refers to; this step's K/V are written into it.
        """
        x = self.embed(batch.token_ids)                          # [T, H]
        rope = self.rope(batch.positions)                        # cos, sin [T, D/2]
        window = self.cfg.sliding_window if batch.sliding_window is None else batch.sliding_window
        sinks = batch.attention_sinks if window else 0
        sink_rope = self.sink_rope(batch.positions, window, sinks)  # None: q scores the sinks
        ccfg = cache.cfg                                         # pages, page size, layout
        # Every layer reads the same block tables: check them (and plan the kernel's
        # work) once per step, not once per layer.
        # The quantized model's products run on Numba's threads: attention takes them
        # too, still awake. The float32 model's run on BLAS's, which would fight them.
        meta = AttentionMetadata.build(batch.block_tables, batch.seq_lens,
                                       batch.query_start_loc, window,
                                       num_pages=ccfg.num_pages, page_size=ccfg.page_size,
                                       threads="numba" if self.quantized else "python",
                                       attention_sinks=sinks, kv_layout=ccfg.kv_layout)
        ops = self.ops(backend)
        for layer in range(self.cfg.num_layers):
            q, k, v = self.qkv(layer, x, rope, ops)              # [T, Hq, D], [T, Hkv, D] x2
            cache.write_kv(layer, batch.slots, k, v)             # scatter into the arena
            k_pages, v_pages = cache.layer(layer)                # views (K as ccfg.kv_layout)
            k_scales, v_scales = cache.layer_scales(layer)       # 8-bit pages' scales, or None
            quant = {} if k_scales is None else dict(k_scales=k_scales, v_scales=v_scales)
            if sink_rope is not None:                            # q at its cache position
                quant["q_sinks"] = apply_rope(q, *sink_rope)     # [T, Hq, D]
            attn = paged_attention(q, k_pages, v_pages, metadata=meta, backend=backend,
                                   **quant)                      # [T, Hq, D]
            x = self.finish_layer(layer, x, attn, ops)           # [T, H]
        return self.logits(x[batch.logits_indices], ops)         # [S, V]

    def sink_rope(self, positions, window, sinks):
        """Cache-relative positions for the attention sinks (StreamingLLM), or None.

        With ``sinks`` kept beside a ``window``, the cache holds positions
        ``0..sinks-1`` and the last ``window``; StreamingLLM numbers them
        ``0, 1, ...`` as they sit in the cache, so a query at ``p`` sits at
        ``min(p, sinks + window - 1)`` and no distance grows past the cache,
        however long the text. RoPE scores depend only on the difference of the
        two positions, so the window's keys (rotated at their own positions when
        written) keep their distances, and only the sinks need another view:
        the query rotated back by ``p - min(p, sinks + window - 1)``. Returns that
        rotation's cos, sin ``[T, D/2]``, or None while no query is that far.
        """
        if not (window and sinks):
            return None
        shift = np.minimum(positions, sinks + window - 1) - positions  # [T] <= 0
        return self.rope(shift) if shift.any() else None

    # ----------------------------------------------------------- dense truth
    def dense_logits(self, token_ids, sliding_window=None, attention_sinks=0) -> np.ndarray:
        """Logits at every position of one sequence, no cache: float32 ``[L, vocab]``.

        ``sliding_window`` (None: the model's) and ``attention_sinks``: the mask
        and positions :meth:`forward` serves with (see :meth:`sink_rope`).
        """
        ids = np.asarray(as_token_ids(token_ids, "token_ids"), dtype=np.int64)  # [L]
        positions = np.arange(len(ids))                          # [L]
        x = self.embed(ids)                                      # [L, H]
        window = (self.cfg.sliding_window if sliding_window is None else sliding_window) or 0
        sinks = attention_sinks if window else 0
        rope = self.rope(positions)                              # cos, sin [L, D/2]
        sink_rope = self.sink_rope(positions, window, sinks)
        for layer in range(self.cfg.num_layers):
            q, k, v = self.qkv(layer, x, rope)                   # [L, Hq, D], [L, Hkv, D] x2
            q_sinks = None if sink_rope is None else apply_rope(q, *sink_rope)
            attn, _ = dense_attention(q, k, v, sliding_window=window, dtype=np.float32,
                                      attention_sinks=sinks, q_sinks=q_sinks)
            x = self.finish_layer(layer, x, attn.astype(np.float32))  # [L, H]
        return self.logits(x)                                    # [L, V]

    def dense_generate(self, prompt_ids, max_tokens: int, stop_token_ids=(), **mask) -> list[int]:
        """Greedy decoding without a cache: recompute everything for each new token.

        Returns the generated ids (prompt excluded); stops after a token in
        ``stop_token_ids`` (included) or after ``max_tokens`` tokens. ``mask``:
        ``sliding_window``, ``attention_sinks`` as in :meth:`dense_logits`.
        """
        ids = as_token_ids(prompt_ids, "prompt_ids")
        max_tokens = check_positive_int("max_tokens", max_tokens)
        stops = set(int(t) for t in stop_token_ids)
        out: list[int] = []
        while len(out) < max_tokens:
            tok = int(np.argmax(self.dense_logits(ids + out, **mask)[-1]))  # greedy, last row
            out.append(tok)
            if tok in stops:
                break
        return out


# ---------------------------------------------------------------------------
# The building blocks (pure functions, float32 in and out).
# ---------------------------------------------------------------------------
def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """``x / rms(x) * weight`` over the last axis: [T, H] -> [T, H]."""
    ms = np.einsum("th,th->t", x, x)[:, None] / np.float32(x.shape[-1])  # [T, 1] mean square
    return x * (1.0 / np.sqrt(ms + np.float32(eps))) * weight    # [T, H]


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate pairs ``(x[i], x[i + D/2])`` by each position's angles (Llama's rotate-half).

    x [T, heads, D]; cos, sin [T, D/2]. The dot product of a rotated q at
    position p and a rotated k at position j depends only on ``p - j``: that
    is how the model knows where tokens are, and why K can be cached once.
    """
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]                        # [T, heads, D/2] each
    c, s = cos[:, None, :], sin[:, None, :]                      # [T, 1, D/2]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)  # [T, heads, D]


def silu(x: np.ndarray) -> np.ndarray:
    """``x * sigmoid(x)``, the gate of SwiGLU."""
    return x / (1.0 + np.exp(-x))


class NumpyOps:
    """The per-layer operations in plain NumPy, as :mod:`.fused` names them (the
    numpy backend's, and the references the fused kernels are tested against)."""

    rms_norm = staticmethod(rms_norm)

    @staticmethod
    def rope_qk(qkv, cos, sin, num_heads: int, num_kv_heads: int, head_dim: int):
        """``qkv`` [T, q+2kv] -> q [T, Hq, D] and k [T, Hkv, D] rotated, v [T, Hkv, D]."""
        T, q_dim, kv_dim = qkv.shape[0], num_heads * head_dim, num_kv_heads * head_dim
        q = qkv[:, :q_dim].reshape(T, num_heads, head_dim)                  # [T, Hq, D]
        k = qkv[:, q_dim:q_dim + kv_dim].reshape(T, num_kv_heads, head_dim)  # [T, Hkv, D]
        v = qkv[:, q_dim + kv_dim:].reshape(T, num_kv_heads, head_dim)      # [T, Hkv, D]
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    @staticmethod
    def silu_mul(gate_up, inter: int):
        """``silu(gate) * up`` of the two halves of ``gate_up`` [T, 2I] -> [T, I]."""
        return silu(gate_up[:, :inter]) * gate_up[:, inter:]
