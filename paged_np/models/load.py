"""load_model: a name, a ``.gguf`` file or a Hugging Face directory in, ``(model, tokenizer)`` out.

The one entry point to real checkpoints: it fetches a known name once
(:mod:`.hub`), reads the file (:mod:`.gguf`, :mod:`.hf`), holds the weights
as the ``quantization`` asks (:mod:`.quantized`, a plug-in) and builds the
model class the file's architecture names (:data:`paged_np.registry.ARCHITECTURES`).
"""


from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import DTypeError, ModelLoadError
from ..registry import WEIGHT_QUANTIZATIONS, model_class
from .llama import LlamaModel
from .quantized import (
    check_quantization,
    is_quantized,
    quantize_weights,
    with_int8_activations,
)
from .tokenizer import Tokenizer


def load_model(name_or_path, dtype=np.float32,
               quantization="gguf") -> tuple[LlamaModel, Tokenizer]:
    """Load a Llama checkpoint: ``(model, tokenizer)``.

    ``name_or_path`` is a known name (``"smollm2-135m-instruct"``, fetched into
    ``PAGED_NP_HOME`` on first use), a ``.gguf`` file, or a Hugging Face model
    directory (``config.json``, ``*.safetensors``, ``tokenizer.json``).
    ``quantization`` says how the weights are held (``dtype`` must be float32; compute
    is float32 but for ``"gguf_a8"``'s integer products):

    - ``"gguf"`` (default): a ``.gguf`` file's quantized tensors stay as the file's
      blocks (Q8_0, Q4_0, Q4_1) and are multiplied by :mod:`paged_np.quant`'s
      kernels; a Hugging Face directory (no blocks) loads as float32;
    - ``"gguf_a8"``: the file's blocks, and each product's input quantized to int8 per
      32-value block, as llama.cpp multiplies (:mod:`paged_np.quant.int8`: integer dot
      products, about 4x fewer instructions; the input's rounding is the price);
    - ``None``: dequantize everything to float32 (BLAS), as before;
    - ``"q8_0"``: quantize float weights to Q8_0 on load (llama.cpp's rule).

    Example (downloads 98 MB on first use)::

        model, tok = pnp.load_model("smollm2-135m-instruct")
        ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Hi"}]))
        model.dense_generate(ids, max_tokens=8, stop_token_ids=tok.stop_token_ids)
    """
    from .gguf import check_dtype, load_gguf
    from .hf import load_hf
    from .hub import KNOWN_MODELS, fetch_model

    if not isinstance(name_or_path, (str, Path)):
        raise DTypeError(f"name_or_path must be a str or a Path, got "
                         f"{type(name_or_path).__name__}")
    check_dtype(dtype)
    check_quantization(quantization)
    if isinstance(name_or_path, str) and name_or_path.lower() in KNOWN_MODELS:
        path = fetch_model(name_or_path)
    else:
        path = Path(name_or_path).expanduser()
    if path.is_dir():
        cfg, weights, tokenizer = load_hf(path)
    elif path.is_file() and path.suffix == ".gguf":
        keep = quantization is not None and WEIGHT_QUANTIZATIONS[quantization].file_blocks
        cfg, weights, tokenizer = load_gguf(path, quantization="gguf" if keep else None)
    elif path.is_file():
        raise ModelLoadError(f"{path}: not a .gguf file; pass a .gguf file or a Hugging Face "
                             "model directory")
    else:
        raise ModelLoadError(f"{name_or_path!r}: no such file or directory, and not a known "
                             f"model name (known: {', '.join(KNOWN_MODELS)})")
    if quantization == "q8_0":
        weights = quantize_weights(weights)
    if quantization == "gguf_a8" and is_quantized(weights):
        weights = with_int8_activations(weights)
    model = model_class(cfg.architecture)(cfg, weights)           # the registry's table
    model.source = (str(path.resolve()), quantization)  # what it was read from (disk tier)
    del weights                                                  # the model holds its own copy
    _return_freed_memory()
    return model, tokenizer


def _return_freed_memory() -> None:
    """Hand the heap the loader freed back to the OS (glibc keeps it otherwise: ~25 MiB
    of dequantization temporaries for SmolLM2). No-op where there is no glibc."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
