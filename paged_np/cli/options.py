"""Command-line flags made from a config's fields: :class:`~paged_np.EngineConfig`'s
everywhere, :class:`~paged_np.server.ServerConfig`'s on ``serve``.

(And ``--quantization`` for ``serve`` and ``chat``, how a real model's weights are
held: a load-time choice, not an engine field; :func:`add_quantization_arg` and
:func:`quantization_of`.)

Every command that runs the engine (``serve``, ``chat``, ``demo``) calls
:func:`add_engine_args` on its parser and :func:`engine_options` on what it
parsed, so each field of the config is a flag everywhere (``prefix_cache``
becomes ``--prefix-cache``, with the field's help and choices) and an option
added to the config needs no change here. A command may give a field its
own default (the server seats more sequences than the toy demo) and older
spellings of a flag (``--pages`` for ``--num-pages``). Any other frozen config
dataclass whose fields carry ``help`` metadata gets its flags the same way
(:func:`add_config_args`, read back by :func:`config_from_args`).

The cache's size is one choice given two ways (``--num-pages`` or
``--kv-cache-memory``): a command's default size is used only when neither
flag is given, so ``--num-pages 40`` never clashes with a default of
``64MiB`` (nor ``--kv-cache-memory 1MiB`` with a default of 40 pages).
"""

from __future__ import annotations

import argparse
import dataclasses
import json

from ..engine.config import EngineConfig
from ..registry import backend_names

#: The two ways to size the cache; a command gives a default for one of them at most.
SIZE_FIELDS = ("num_pages", "kv_cache_memory")
#: Where :func:`add_engine_args` keeps that default, used when neither flag is given.
SIZE_DEFAULT = "default_cache_size"


def flag(name: str) -> str:
    """``max_num_seqs`` -> ``--max-num-seqs``."""
    return "--" + name.replace("_", "-")


def add_engine_args(parser: argparse.ArgumentParser, defaults: dict | None = None,
                    aliases: dict | None = None) -> argparse._ArgumentGroup:
    """Add one flag per :class:`EngineConfig` field to ``parser``; returns their group.

    ``defaults`` overrides a field's default for this command; ``aliases``
    maps a field to extra spellings of its flag (``{"num_pages": ["--pages"]}``).
    """
    defaults, aliases = defaults or {}, aliases or {}
    if all(defaults.get(name) is not None for name in SIZE_FIELDS):
        raise ValueError(f"give a default for one of {SIZE_FIELDS}, not both")
    unknown = set(defaults) | set(aliases)
    unknown -= {f.name for f in dataclasses.fields(EngineConfig)}
    if unknown:
        raise ValueError(f"not EngineConfig fields: {sorted(unknown)}")
    group = parser.add_argument_group("engine", "the paged cache and the scheduler "
                                      "(paged_np.EngineConfig)")
    for f in dataclasses.fields(EngineConfig):
        default = defaults.get(f.name, f.default)
        names, kw = field_flag(f, default, aliases.get(f.name, ()))
        if f.name in SIZE_FIELDS:               # the size's default: only when no size is given
            kw["default"] = None
            if default is not None:
                parser.set_defaults(**{SIZE_DEFAULT: {f.name: default}})
        group.add_argument(*names, **kw)
    return group


def field_flag(f: dataclasses.Field, default, aliases=()) -> tuple[list, dict]:
    """One config field as ``add_argument``'s names and keywords.

    The field's metadata says how: ``help``; ``choices``; ``flags`` (its
    spellings, when not ``--field-name``); ``metavar``; ``type`` (else a bool is
    ``--x/--no-x``, ``json`` reads a JSON object, a choice or
    ``kv_cache_memory`` a str, anything else an int).
    """
    meta = dict(f.metadata)
    names = [*meta.get("flags", [flag(f.name)]), *aliases]
    kw = dict(dest=f.name, default=default, help=f"{meta['help']} (default: {default})")
    choices = meta.get("choices")
    if choices == "engine-backends":
        choices = backend_names(engine=True)
    if choices is not None:
        kw["choices"] = list(choices)
    if "metavar" in meta:
        kw["metavar"] = meta["metavar"]
    if isinstance(f.default, bool):
        kw["action"] = argparse.BooleanOptionalAction
    elif meta.get("json"):                      # a nested config, given as a JSON object
        kw["type"] = json_object
        kw["metavar"] = "JSON"
    elif "type" in meta:
        kw["type"] = meta["type"]
    elif f.name == "kv_cache_memory" or choices is not None:
        kw["type"] = str
    else:
        kw["type"] = int
    return names, kw


def add_config_args(parser: argparse.ArgumentParser, cls, title: str,
                    description: str | None = None) -> argparse._ArgumentGroup:
    """Add one flag per field of the config dataclass ``cls`` to ``parser`` (a group
    named ``title``), each with the field's default and help; returns the group."""
    group = parser.add_argument_group(title, description)
    for f in dataclasses.fields(cls):
        names, kw = field_flag(f, f.default)
        group.add_argument(*names, **kw)
    return group


def config_from_args(cls, args: argparse.Namespace,
                     parser: argparse.ArgumentParser | None = None):
    """The ``cls`` config (validated) that the flags :func:`add_config_args` made describe.

    With ``parser``, a value the config refuses exits through ``parser.error``
    with the config's message, as a bad flag does.
    """
    from ..errors import PagedNPError

    try:
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})
    except PagedNPError as e:
        if parser is None:
            raise
        parser.error(str(e))


def json_object(text: str) -> dict:
    """A flag's value read as a JSON object (``--speculative-config '{"method": "ngram"}'``)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object {{...}}, got {text!r}")
    return value


def engine_options(args: argparse.Namespace) -> dict:
    """The :class:`EngineConfig` fields from parsed flags, as keyword arguments."""
    options = {f.name: getattr(args, f.name) for f in dataclasses.fields(EngineConfig)}
    if options["num_pages"] is None and options["kv_cache_memory"] is None:
        options.update(getattr(args, SIZE_DEFAULT, {}))
    return options


def engine_config(args: argparse.Namespace,
                  parser: argparse.ArgumentParser | None = None) -> EngineConfig:
    """The :class:`EngineConfig` the parsed flags describe (validated).

    With ``parser``, a value the config refuses (``--num-pages 0``) exits
    through ``parser.error`` with the config's message, as a bad flag does.
    """
    from ..errors import PagedNPError

    try:
        return EngineConfig(**engine_options(args))
    except PagedNPError as e:
        if parser is None:
            raise
        parser.error(str(e))


#: ``--quantization`` values: :data:`paged_np.models.QUANTIZATIONS`, ``none`` for None.
QUANTIZATION_CHOICES = ("gguf", "gguf_a8", "q8_0", "none")


def add_quantization_arg(parser: argparse.ArgumentParser) -> None:
    """``--quantization``: how a loaded checkpoint's weights are held (load_model's)."""
    parser.add_argument("--quantization", choices=QUANTIZATION_CHOICES, default="gguf",
                        help="how a checkpoint's weights are held: gguf (the file's blocks, "
                             "float32 inputs; default), gguf_a8 (the same blocks times "
                             "int8 inputs, llama.cpp's arithmetic), q8_0 (quantize on "
                             "load), none (float32)")


def quantization_of(args: argparse.Namespace, parser=None, random_model: bool = False):
    """``--quantization`` as :func:`paged_np.load_model` takes it. A random toy model has
    float32 weights only: with ``random_model``, another choice than the default exits
    through ``parser.error`` (when given) as a refused flag does."""
    if random_model and args.quantization != "gguf":
        message = (f"--quantization {args.quantization}: the random toy model has float32 "
                   "weights only; drop the flag or load a checkpoint")
        if parser is not None:
            parser.error(message)
        from ..errors import InvalidArgument

        raise InvalidArgument(message)
    return None if args.quantization == "none" else args.quantization
