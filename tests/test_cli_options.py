"""Every engine option is a flag of every command that runs the engine, and reaches it.

The flags are made from :class:`paged_np.EngineConfig`'s fields
(:mod:`paged_np.cli.options`), so a field added to the config without a flag,
or a command that builds its engine from anything else, fails here.
"""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from paged_np.cli import chat, demo, demo_model, serve
from paged_np.cli.options import engine_config, engine_options, flag
from paged_np.engine.config import EngineConfig
from paged_np.registry import backend_names

#: command -> its parser (each command that builds an Engine or an LLM).
PARSERS = {"serve": serve.build_parser, "chat": chat.build_parser,
           "demo --model tiny": demo.build_parser, "demo": demo_model.build_parser}
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
    assert engine_options(chat.build_parser().parse_args([]))["kv_cache_memory"] == "64MiB"
    toy = demo.build_parser().parse_args(["--pages", "12", "--preemption", "swap"])
    assert (toy.num_pages, toy.preemption_mode) == (12, "swap")
    assert engine_options(demo.build_parser().parse_args([]))["num_pages"] == 40
    assert engine_options(demo_model.build_parser().parse_args([]))["num_pages"] == 24


@pytest.mark.parametrize("command", sorted(PARSERS))
def test_backend_choices_come_from_the_registry(command):
    backend = next(a for a in PARSERS[command]()._actions if a.dest == "backend")
    assert tuple(backend.choices) == backend_names(engine=True)


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
