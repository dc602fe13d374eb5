"""Models that run on the paged cache, and the loaders that read real checkpoints.

- :mod:`.llama`: a Llama-style decoder written in NumPy (RMSNorm, RoPE, grouped
  query attention through :func:`paged_np.paged_attention`, SwiGLU). Small
  random weights for tests and the toy demo, or a real checkpoint's.
- :mod:`.tokenizer`: text <-> token ids, chat templates, streaming text.
- :mod:`.gguf` and :mod:`.hf`: checkpoint files -> ``(config, weights, tokenizer)``.
- :mod:`.hub`: known names (``"smollm2-135m-instruct"``) fetched once into
  ``PAGED_NP_HOME``.

:func:`load_model` is the one entry point: a name, a ``.gguf`` file or a
Hugging Face directory in, ``(model, tokenizer)`` out.
"""

from ..lazy import lazy_exports

#: Public name -> the module that defines it (imported on first use: the tokenizer and
#: the quantized weights are plug-ins a float32 step never loads).
_EXPORTS = {
    "ForwardBatch": ".llama", "LlamaModel": ".llama", "load_model": ".load",
    "Tokenizer": ".tokenizer", "IncrementalDetokenizer": ".tokenizer",
    "QUANTIZATIONS": ".quantized", "check_quantization": ".quantized",
    "is_quantized": ".quantized", "quantize_weights": ".quantized",
    "with_int8_activations": ".quantized",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = ["ForwardBatch", "LlamaModel", "QUANTIZATIONS", "Tokenizer",
           "IncrementalDetokenizer", "load_model"]
