"""Every engine option is a flag of every command that runs the engine, and reaches it.

The flags are made from :class:`paged_np.EngineConfig`'s fields
(:mod:`paged_np.cli.options`), so a field added to the config without a flag,
or a command that builds its engine from anything else, fails here. Their
choices are the registries' (:mod:`paged_np.registry`) when the parser is
built: an eviction policy, a prefix index and an attention backend registered
here, outside the package, are accepted by every command's flags and reach
the engine.
"""

from __future__ import annotations

import argparse
import dataclasses
import types

import pytest

from paged_np import registry
from paged_np.cache.eviction import EvictionPolicy
from paged_np.cache.hash_index import HashIndex
from paged_np.cli import chat, demo, demo_model, serve
from paged_np.cli import eval as eval_cli
from paged_np.cli.options import (
    COMMAND_DEFAULTS,
    add_engine_args,
    check_fields,
    engine_config,
    engine_options,
    flag,
)
from paged_np.engine.config import EngineConfig
from paged_np.registry import KV_FORMATS, WEIGHT_QUANTIZATIONS, backend_names

#: command -> its parser (each command that builds an Engine or an LLM).
PARSERS = {"serve": serve.build_parser, "chat": chat.build_parser,
           "demo --model tiny": demo.build_parser, "demo": demo_model.build_parser,
           "eval": eval_cli.build_parser}
FIELDS = [f.name for f in dataclasses.fields(EngineConfig)]
CHOSEN = ["--prefix-cache", "radix", "--schedule", "lpm", "--preemption-mode", "swap"]


def option_strings(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    """dest -> the flags that set it."""
    return {a.dest: a.option_strings for a in parser._actions}


@pytest.mark.parametrize("command", sorted(PARSERS))
@pytest.mark.parametrize("field", FIELDS)
def test_every_config_field_is_a_flag(command, field):
    flags = option_strings(PARSERS[command]())
    assert field in flags, f"{command}: EngineConfig.{field} has no flag"
    assert flag(field) in flags[field]


@pytest.mark.parametrize("command", sorted(PARSERS))
def test_chosen_options_parse_into_the_config(command):
    args = PARSERS[command]().parse_args(CHOSEN)
    cfg = engine_config(args)
    assert (cfg.prefix_cache, cfg.schedule, cfg.preemption_mode) == ("radix", "lpm", "swap")


@pytest.mark.parametrize("command", sorted(PARSERS))
def test_defaults_make_a_valid_config_with_one_size(command):
    """Each command's own defaults validate, and size the cache one way at most (none:
    the config's ``DEFAULT_KV_CACHE_MEMORY``)."""
    cfg = engine_config(PARSERS[command]().parse_args([]))
    assert cfg.num_pages is None or cfg.kv_cache_memory is None


@pytest.mark.parametrize("command", sorted(PARSERS))
def test_a_given_size_replaces_the_default_size(command):
    parser = PARSERS[command]()
    by_pages = engine_config(parser.parse_args(["--num-pages", "7"]))
    assert (by_pages.num_pages, by_pages.kv_cache_memory) == (7, None)
    by_bytes = engine_config(parser.parse_args(["--kv-cache-memory", "1MiB"]))
    assert (by_bytes.num_pages, by_bytes.kv_cache_memory) == (None, "1MiB")


def test_commands_keep_their_defaults_and_old_spellings():
    assert engine_options(serve.build_parser().parse_args([]))["max_num_seqs"] == 32
    assert chat.parse_args([]).config.kv_cache_memory == "64MiB"
    toy = demo.parse_args(["--model", "tiny", "--pages", "12", "--preemption", "swap"])
    assert (toy.config.num_pages, toy.config.preemption_mode) == (12, "swap")
    assert demo.parse_args(["--model", "tiny"]).config.num_pages == 40
    assert demo_model.parse_args([]).config.num_pages == 24


@pytest.mark.parametrize("command", sorted(COMMAND_DEFAULTS))
def test_each_command_default_is_a_field_and_parses(command):
    """One table of defaults for every command, each an EngineConfig field override."""
    parser = argparse.ArgumentParser()
    add_engine_args(parser, command)
    cfg = engine_config(parser.parse_args([]))
    for name, value in COMMAND_DEFAULTS[command].items():
        assert getattr(cfg, name) == value, (command, name)


def test_a_defaults_table_with_a_field_the_config_lacks_is_refused():
    with pytest.raises(ValueError, match="not EngineConfig fields"):
        check_fields({"max_num_seq": 4}, "mine")
    with pytest.raises(ValueError, match="not both"):
        add_engine_args(argparse.ArgumentParser(),
                        defaults={"num_pages": 4, "kv_cache_memory": "1MiB"})


def _action(parser, dest):
    return next(a for a in parser._actions if a.dest == dest)


@pytest.mark.parametrize("command", sorted(PARSERS))
def test_choices_come_from_the_registries(command):
    parser = PARSERS[command]()
    assert tuple(_action(parser, "backend").choices) == backend_names(engine=True)
    assert tuple(_action(parser, "kv_cache_dtype").choices) == ("auto", *KV_FORMATS)
    assert engine_config(parser.parse_args(["--kv-cache-dtype", "auto"])).kv_cache_dtype \
        == "auto"
    for field, reg in (("eviction_policy", registry.EVICTION_POLICIES),
                       ("prefix_cache", registry.PREFIX_INDEXES),
                       ("schedule", registry.SCHEDULES),
                       ("preemption_mode", registry.PREEMPTION_MODES)):
        assert tuple(_action(parser, field).choices) == tuple(reg), field
    if command in ("serve", "chat"):
        assert tuple(_action(parser, "quantization").choices) == tuple(WEIGHT_QUANTIZATIONS)


# ------------------------------------------------- choices registered from outside
CALLS: list[str] = []


class MostRecentFirst(EvictionPolicy):
    """MRU: a policy the package does not have."""

    name = "mru_cli_test"

    def priority(self, entry):
        CALLS.append("policy")
        return -entry.last_access_time


class CountingIndex(HashIndex):
    """The hash chain, counting its lookups."""

    def match_prefix(self, prompt, extra_key=None):
        CALLS.append("index")
        return super().match_prefix(prompt, extra_key)


def _counting_numpy_backend():
    """A backend module of one function: the numpy backend's forward, counted."""
    numpy_paged = registry.ATTENTION_BACKENDS.load("numpy")

    def forward(*args, **kwargs):
        CALLS.append("backend")
        return numpy_paged.forward(*args, **kwargs)

    return types.SimpleNamespace(forward=forward)


#: (registry, the option that chooses from it, the name, the target)
OUTSIDE = [(registry.EVICTION_POLICIES, "eviction_policy", "mru_cli_test", MostRecentFirst),
           (registry.PREFIX_INDEXES, "prefix_cache", "counting_cli_test", CountingIndex),
           (registry.ATTENTION_BACKENDS, "backend", "counting_cli_test",
            _counting_numpy_backend())]


@pytest.fixture
def outside_choices():
    """Registers OUTSIDE's choices; ``--flag name`` for each; unregisters them after."""
    for reg, _, name, target in OUTSIDE:
        reg.register(name, target, "a test's own", engine=True)
    CALLS.clear()
    try:
        yield [part for _, option, name, _ in OUTSIDE for part in (flag(option), name)]
    finally:
        for reg, _, name, _ in OUTSIDE:
            reg.unregister(name)


@pytest.mark.parametrize("command", sorted(PARSERS))
def test_a_choice_registered_outside_is_a_choice_of_each_flag(command, outside_choices):
    """Built after the registration, every engine command's parser accepts the new names
    and its config carries them."""
    parser = PARSERS[command]()
    cfg = engine_config(parser.parse_args(outside_choices), parser)
    for _, option, name, _ in OUTSIDE:
        assert name in _action(parser, option).choices
        assert getattr(cfg, option) == name


def test_a_choice_unregistered_is_refused_by_a_parser_built_after(outside_choices, capsys):
    for reg, _, name, _ in OUTSIDE:
        reg.unregister(name)
    try:
        with pytest.raises(SystemExit):
            chat.parse_args(["--model", "tiny", *outside_choices[:2]])
        assert "--eviction-policy: invalid choice: 'mru_cli_test'" in capsys.readouterr().err
    finally:                                      # the fixture unregisters them again
        for reg, _, name, target in OUTSIDE:
            reg.register(name, target, "a test's own", engine=True)


def test_chat_serves_with_the_choices_registered_outside(outside_choices):
    """End to end through the command's own path: the flags -> one EngineConfig ->
    ``LLM(config=)``; the policy, the index and the backend each do their work."""
    from paged_np.engine.sampling import SamplingParams

    args = chat.parse_args(["--model", "tiny", "--num-pages", "6", "--page-size", "4",
                            *outside_choices])
    llm = chat.make_llm(args)
    assert llm.engine.config == args.config
    assert isinstance(llm.engine.cache.prefix_index, CountingIndex)
    params = SamplingParams(max_tokens=6, temperature=0.0)
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 6, 7, 8, 10], [11, 12, 13, 14, 15]]
    for prompt in prompts:                        # one at a time: each leaves pages cached
        llm.generate([prompt], params)
    assert {"policy", "index", "backend"} <= set(CALLS), sorted(set(CALLS))
    assert llm.engine.cache.pool.eviction_policy == "mru_cli_test"
    llm.engine.cache.check_invariants()


def test_a_refused_value_exits_like_a_bad_flag(capsys):
    with pytest.raises(SystemExit):
        demo.parse_args(["--model", "tiny", "--pages", "0"])
    assert "num_pages" in capsys.readouterr().err


def test_serve_passes_every_option_to_the_engine():
    """End to end: ``serve --prefix-cache radix --schedule lpm ...`` -> ``llm.engine.config``."""
    argv = ["--model", serve.TINY_MODEL, "--num-pages", "24", "--page-size", "8",
            "--max-num-seqs", "4", "--backend", "numpy", "--swap-pages", "6", *CHOSEN]
    args = serve.build_parser().parse_args(argv)
    llm = serve.build_llm(args)
    got = llm.engine.config
    assert got == engine_config(args)
    assert (got.prefix_cache, got.schedule, got.preemption_mode, got.swap_pages) == (
        "radix", "lpm", "swap", 6)
    assert llm.engine.cache.cfg.num_pages == 24 and llm.engine.cache.cfg.prefix_cache == "radix"


def test_quantization_flag_reaches_load_model():
    """``--quantization`` on serve and chat; ``none`` means float32. (Not on the demo:
    its check is that paged greedy tokens equal a dense forward's, which int8 inputs,
    rounding tiny differences a whole step apart, do not keep.)"""
    from paged_np.cli.options import quantization_of

    for parse in (lambda a: serve.build_parser().parse_args(a), chat.parse_args):
        assert quantization_of(parse([])) == "gguf"
        assert quantization_of(parse(["--quantization", "gguf_a8"])) == "gguf_a8"
        assert quantization_of(parse(["--quantization", "none"])) is None
    args = serve.build_parser().parse_args(["--quantization", "gguf_a8", "--num-pages", "8"])
    llm = serve.build_llm(args)                                  # the real model, int8 inputs
    assert llm.engine.model.wqkv[0].int8_activations


def test_quantization_flag_refused_for_the_random_model(capsys):
    with pytest.raises(SystemExit):
        chat.parse_args(["--model", "tiny", "--quantization", "gguf_a8"])
    assert "--quantization gguf_a8" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        serve.build_parser().parse_args(["--quantization", "int4"])
    assert "--quantization" in capsys.readouterr().err
