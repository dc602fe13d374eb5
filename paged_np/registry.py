"""The tables that name what can be plugged in: attention backends and model architectures.

Each is read by every entry point that offers a choice, so a name is listed
once: :func:`paged_np.paged_attention`, the :class:`~paged_np.Engine` (through
:class:`~paged_np.EngineConfig`), every command's ``--backend`` flag and
``python -m paged_np info`` all read :data:`ATTENTION_BACKENDS`;
:func:`paged_np.load_model` reads :data:`ARCHITECTURES`.

A new backend is one module with a ``forward(...)`` function (see
:mod:`paged_np.attention`) and one line here. Nothing is imported from this
module at import time: the entries name modules as strings, loaded only when
chosen, so ``python -m paged_np info`` never compiles a kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import InvalidArgument


@dataclass(frozen=True)
class BackendSpec:
    """One attention backend: where its ``forward`` lives and where it can run.

    ``engine`` says whether the serving engine can use it: the engine keeps its
    arena in host memory and runs the model in NumPy, so a backend whose pages
    must live on a GPU is a kernel to call, not yet an engine option.
    """

    module: str
    about: str
    engine: bool = True
    why_not_engine: str = ""


#: name -> spec. "auto" is not a backend but a rule, resolved per call.
ATTENTION_BACKENDS = {
    "numpy": BackendSpec("paged_np.attention.numpy_paged", "the lesson, page by page"),
    "numba": BackendSpec("paged_np.attention.numba_cpu", "jitted, parallel CPU"),
    "cuda": BackendSpec(
        "paged_np.attention.numba_cuda", "optional numba.cuda", engine=False,
        why_not_engine="the engine keeps its arena in host memory; call "
                       "paged_attention(..., backend='cuda') on a device arena "
                       "(PagedKVCache(cfg, device='cuda')) instead"),
}
AUTO = "auto"


def backend_names(engine: bool = False) -> tuple[str, ...]:
    """The names a caller may pass: every backend, or those the engine runs, then "auto"."""
    return tuple(n for n, s in ATTENTION_BACKENDS.items() if s.engine or not engine) + (AUTO,)


def check_backend(name, owner: str = "backend", engine: bool = False) -> str:
    """``name`` if it is a backend (one the engine runs, with ``engine=True``), else raise.

    Every entry point refuses the same names with the same reason.
    """
    if isinstance(name, str) and engine and name in ATTENTION_BACKENDS \
            and not ATTENTION_BACKENDS[name].engine:
        raise InvalidArgument(f"{owner}={name!r} is not an engine backend: "
                              f"{ATTENTION_BACKENDS[name].why_not_engine}")
    allowed = backend_names(engine)
    if not isinstance(name, str) or name not in allowed:
        raise InvalidArgument(f"{owner} must be one of {allowed}, got {name!r}")
    return name


@dataclass(frozen=True)
class ArchitectureSpec:
    """One model family: the class that runs it and the names checkpoints give it."""

    model: tuple[str, str]                 # (module, class), imported on demand
    gguf_names: tuple[str, ...] = ()       # GGUF ``general.architecture``
    hf_names: tuple[str, ...] = ()         # Hugging Face ``config.json`` "architectures"


#: Our name for a model family -> its spec. :func:`paged_np.load_model` builds
#: ``model_class(cfg.architecture)``; each loader accepts only the names listed here.
ARCHITECTURES = {
    "llama": ArchitectureSpec(("paged_np.models.llama", "LlamaModel"), gguf_names=("llama",),
                              hf_names=("LlamaForCausalLM", "MistralForCausalLM")),
}


def architecture_for(checkpoint_name: str, fmt: str) -> str | None:
    """Our family name for a checkpoint's own architecture name (``fmt``: "gguf" or "hf")."""
    for family, spec in ARCHITECTURES.items():
        if checkpoint_name in (spec.gguf_names if fmt == "gguf" else spec.hf_names):
            return family
    return None


def supported_names(fmt: str) -> tuple[str, ...]:
    """Every checkpoint architecture name a loader of ``fmt`` accepts."""
    return tuple(n for s in ARCHITECTURES.values()
                 for n in (s.gguf_names if fmt == "gguf" else s.hf_names))


def model_class(architecture: str):
    """The model class of a family in :data:`ARCHITECTURES` (imported on demand)."""
    import importlib

    from .errors import ModelLoadError

    if architecture not in ARCHITECTURES:
        raise ModelLoadError(f"architecture {architecture!r} is not supported (supported: "
                             f"{', '.join(ARCHITECTURES)})")
    module, name = ARCHITECTURES[architecture].model
    return getattr(importlib.import_module(module), name)
