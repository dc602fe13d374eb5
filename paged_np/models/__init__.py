"""Models that run on the paged cache.

:mod:`.llama` is a Llama-style decoder written in NumPy: RMSNorm, RoPE, grouped
query attention through :func:`paged_np.paged_attention`, SwiGLU. It runs with
small random weights for tests and the toy demo.
"""

from .llama import ForwardBatch, TinyLlama
from .tokenizer import IncrementalDetokenizer, Tokenizer

__all__ = ["ForwardBatch", "TinyLlama", "Tokenizer", "IncrementalDetokenizer"]
