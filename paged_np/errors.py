"""The errors paged_np raises.

Every error derives from :class:`PagedNPError`, so ``except pnp.PagedNPError``
catches anything this package refuses. Errors about bad arguments also derive
from the matching built-in (``ValueError`` or ``TypeError``), so code that
already catches those keeps working. Out-of-range indices (a layer, a page id,
a slot) raise :class:`IndexOutOfRange`, a ``ValueError``: never a bare
``IndexError`` or ``KeyError``.

A refused call changes nothing: the cache, the pool and the arena are exactly
as they were before the call.
"""

from __future__ import annotations


class PagedNPError(Exception):
    """Base class of every error raised by paged_np."""


class OutOfPages(PagedNPError):
    """No page is FREE or CACHED: the allocation cannot be served.

    The pool is left unchanged. A serving engine answers this by preempting
    a running sequence (vLLM does the same).
    """


class SequenceTooLong(OutOfPages):
    """The allocation could never be served: the sequence needs more pages than the arena has.

    An :class:`OutOfPages` ("not now"), so code that catches that around
    ``allocate_slots`` catches this too; catch this class first to tell "never"
    apart. Preempting other sequences does not help; the engine fails such a
    request alone.
    """


class UnknownSequence(PagedNPError, LookupError):
    """A sequence id that the cache does not hold."""


class UnknownRequest(PagedNPError, LookupError):
    """A request id that the engine (or :class:`~paged_np.LLM`) is not running or holding.

    Requests and sequences are different things: one request of ``n`` samples
    runs as ``n`` sequences in the cache, so each has its own error.
    """


class InvalidBlockTable(PagedNPError, ValueError):
    """A block table that points outside the arena or has holes."""


class StalePage(PagedNPError, ValueError):
    """A page used as if it were held (freed twice, shared while free, ...)."""


class InvalidArgument(PagedNPError, ValueError):
    """An argument with a bad value; the message names the argument."""


class ShapeError(InvalidArgument):
    """An array argument with the wrong number of dimensions or sizes."""


class IndexOutOfRange(InvalidArgument):
    """A layer, page id or slot outside the arena."""


class DuplicateSequence(InvalidArgument):
    """A sequence id that the cache already holds."""


class DTypeError(PagedNPError, TypeError):
    """An argument of the wrong type or array dtype."""


class BackendUnavailable(PagedNPError, ImportError):
    """The requested attention backend cannot be imported here."""


class CudaUnavailable(BackendUnavailable):
    """``backend="cuda"`` asked for, but ``numba.cuda`` has no GPU and no simulator.

    A :class:`BackendUnavailable` (an ``ImportError`` too): importing
    :mod:`paged_np.attention.numba_cuda` raises it, and the message says how to
    install the ``cuda`` extra or turn on Numba's CUDA simulator.
    """


class ModelLoadError(PagedNPError):
    """A checkpoint that cannot be loaded: missing file, unsupported architecture or
    quantization type, malformed config. The message names the fix."""


class ModelFetchError(ModelLoadError):
    """A known model that cannot be fetched (no network, checksum mismatch). The message
    gives the command to run and where to put the file."""


class ChatTemplateError(PagedNPError, ValueError):
    """A chat template that is missing, does not compile, or refuses the conversation."""


__all__ = [
    "PagedNPError",
    "OutOfPages",
    "SequenceTooLong",
    "UnknownRequest",
    "UnknownSequence",
    "InvalidBlockTable",
    "StalePage",
    "InvalidArgument",
    "ShapeError",
    "IndexOutOfRange",
    "DuplicateSequence",
    "DTypeError",
    "BackendUnavailable",
    "CudaUnavailable",
    "ModelLoadError",
    "ModelFetchError",
    "ChatTemplateError",
]
