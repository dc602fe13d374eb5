"""Command-line flags made from a config's fields: :class:`~paged_np.EngineConfig`'s
on every command that runs the engine, ``ServerConfig``'s on ``serve``.

(And ``--quantization`` for ``serve`` and ``chat``, how a real model's weights are
held: a load-time choice, not an engine field; :func:`add_quantization_arg` and
:func:`quantization_of`.)

Every command that runs the engine (``serve``, ``chat``, ``demo``, ``eval``)
calls :func:`add_engine_args` on its parser and :func:`engine_config` on what
it parsed, and passes that one :class:`EngineConfig` on (``LLM(model,
config=cfg)``, ``Engine(model, cfg)``), never a dict rebuilt downstream. Each
field of the config is a flag everywhere (``prefix_cache`` becomes
``--prefix-cache``, with the field's help), so an option added to the config
needs no change here. A flag's choices are read from the field's registry
(:mod:`paged_np.registry`) when the parser is built, so a policy, an index or
a backend registered from outside the package is accepted by
``--eviction-policy``, ``--prefix-cache`` or ``--backend`` too.

A command may give a field its own default (the server seats more sequences
than the toy demo): :data:`COMMAND_DEFAULTS`, one table for every command.
The demos keep their older spellings (``--pages`` for ``--num-pages``):
:data:`ALIASES`. Any other frozen config dataclass whose fields carry
``help`` metadata gets its flags the same way (:func:`add_config_args`, read
back by :func:`config_from_args`).

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
from ..registry import KV_FORMATS, WEIGHT_QUANTIZATIONS, backend_names

#: EngineConfig's fields by name: one flag each.
FIELDS = {f.name: f for f in dataclasses.fields(EngineConfig)}
#: The two ways to size the cache; a command gives a default for one of them at most.
SIZE_FIELDS = ("num_pages", "kv_cache_memory")
#: Where :func:`add_engine_args` keeps that default, used when neither flag is given.
SIZE_DEFAULT = "default_cache_size"

#: Each command's own defaults for engine options, as EngineConfig field -> value
#: (every other field keeps the config's default): the one table of them.
COMMAND_DEFAULTS = {
    # the toy demo: a cache too small for its stream, so requests wait, are
    # preempted and come back; the engine's own seats and step budget
    "demo --model tiny": {"num_pages": 40},
    # the real demo: 24 pages hold far fewer tokens than 16 chat requests need together
    "demo": {"num_pages": 24, "max_num_seqs": 16, "max_num_batched_tokens": 512},
    # one conversation: a smaller arena than a server's; the LLM's seats and budget
    "chat": {"kv_cache_memory": "64MiB", "max_num_seqs": 16, "max_num_batched_tokens": 512},
    # a server seats more sequences, and batches more tokens, than the library's defaults
    "serve": {"max_num_seqs": 32, "max_num_batched_tokens": 512},
    # one long prompt, prefilled 512 tokens a step
    "eval": {"max_num_batched_tokens": 512},
}
#: The spellings the demos had before every engine option became a flag.
ALIASES = {"num_pages": ["--pages"], "preemption_mode": ["--preemption"]}


def check_fields(table: dict, what: str) -> dict:
    """``table`` if every key is an EngineConfig field and one size at most is set."""
    unknown = sorted(set(table) - set(FIELDS))
    if unknown:
        raise ValueError(f"{what}: not EngineConfig fields: {unknown}")
    if all(table.get(name) is not None for name in SIZE_FIELDS):
        raise ValueError(f"{what}: give a default for one of {SIZE_FIELDS}, not both")
    return table


for _command, _table in COMMAND_DEFAULTS.items():      # a misspelt field fails on import
    check_fields(_table, f"COMMAND_DEFAULTS[{_command!r}]")
check_fields(ALIASES, "ALIASES")


def flag(name: str) -> str:
    """``max_num_seqs`` -> ``--max-num-seqs``."""
    return "--" + name.replace("_", "-")


def flag_choices(f: dataclasses.Field) -> tuple[str, ...] | None:
    """The names a field's flag accepts, read from its registry now; None: any value.

    :func:`add_engine_args` calls it as it builds a parser, so a choice
    registered before then (from inside or outside the package) is one.
    """
    registry = f.metadata.get("choices")
    if registry is None:
        return None
    if isinstance(registry, str):               # "engine-backends": those the engine runs
        return backend_names(engine=True)
    names = tuple(registry)
    if registry is KV_FORMATS:                  # vLLM's "auto": the model's dtype, float32 here
        names = ("auto", *names)
    return names


def add_engine_args(parser: argparse.ArgumentParser, command: str | None = None, *,
                    defaults: dict | None = None,
                    aliases: dict | None = None) -> argparse._ArgumentGroup:
    """Add one flag per :class:`EngineConfig` field to ``parser``; returns their group.

    ``command`` names this command's defaults in :data:`COMMAND_DEFAULTS`
    (``defaults`` gives a table instead, for a command of one's own);
    ``aliases`` maps a field to extra spellings of its flag (:data:`ALIASES`).
    """
    if defaults is None:
        defaults = COMMAND_DEFAULTS[command] if command is not None else {}
    check_fields(defaults, command or "defaults")
    aliases = check_fields(aliases or {}, "aliases")
    group = parser.add_argument_group("engine", "the paged cache and the scheduler "
                                      "(paged_np.EngineConfig)")
    for f in FIELDS.values():
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

    The field's metadata says how: ``help``; ``choices`` (a registry, read now:
    :func:`flag_choices`); ``flags`` (its spellings, when not ``--field-name``);
    ``metavar``; ``type`` (else a bool is ``--x/--no-x``, ``json`` reads a JSON
    object, a choice or ``kv_cache_memory`` a str, anything else an int).
    """
    meta = f.metadata
    names = [*meta.get("flags", [flag(f.name)]), *aliases]
    kw = dict(dest=f.name, default=default, help=f"{meta['help']} (default: {default})")
    choices = flag_choices(f)
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
    """The :class:`EngineConfig` fields from parsed flags, as keyword arguments
    (what :func:`engine_config` builds the config from)."""
    options = {name: getattr(args, name) for name in FIELDS}
    if options["num_pages"] is None and options["kv_cache_memory"] is None:
        options.update(getattr(args, SIZE_DEFAULT, {}))
    return options


def engine_config(args: argparse.Namespace,
                  parser: argparse.ArgumentParser | None = None) -> EngineConfig:
    """The :class:`EngineConfig` the parsed flags describe (validated): the one object
    a command builds and passes on.

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


def add_quantization_arg(parser: argparse.ArgumentParser) -> None:
    """``--quantization``: how a loaded checkpoint's weights are held (load_model's), one
    of :data:`paged_np.registry.WEIGHT_QUANTIZATIONS` (read now; "none" is float32)."""
    about = ", ".join(f"{name} ({e.about})" for name, e in WEIGHT_QUANTIZATIONS.items())
    parser.add_argument("--quantization", choices=list(WEIGHT_QUANTIZATIONS), default="gguf",
                        help=f"how a checkpoint's weights are held: {about} (default: gguf)")


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
    return load_quantization(args.quantization)


def load_quantization(name: str):
    """A name of :data:`~paged_np.registry.WEIGHT_QUANTIZATIONS` as ``load_model`` takes it
    ("none", float32 weights, is ``None`` there)."""
    return None if name == "none" else WEIGHT_QUANTIZATIONS.check(name)
