"""python -m paged_np chat, fed through stdin: streamed answers, one status line per turn,
later turns reuse the earlier turns' pages."""

from __future__ import annotations

import io
import re

import paged_np as pnp
from paged_np.cli import chat


def test_chat_streams_and_reuses_the_conversation(capsys):
    out = io.StringIO()
    stdin = io.StringIO("Hello there\n\nWhat is the capital of France?\n/exit\n")
    assert chat.main(["--model", "tiny", "--max-tokens", "6", "--backend", "numpy"],
                     stdin=stdin, stdout=out) == 0
    text = out.getvalue()
    status = re.findall(r"\[reused (\d+) of (\d+) prompt tokens from the cache \| pages: "
                        r"(\d+) in use, (\d+) cached of (\d+) \| ([\d.]+) tokens/s\]", text)
    assert len(status) == 2                                      # the empty line is no turn
    (r1, p1, *_), (r2, p2, used, cached, total, _) = [tuple(map(float, s)) for s in status]
    assert r1 == 0 and p2 > p1
    assert r2 >= (p1 // 16) * 16 > 0         # the first turn's full pages came from the cache
    assert used == 0 and 0 < cached <= total                     # finished: pages stay cached
    # the streamed answers are exactly what the tokenizer decodes from the model's tokens
    tok = pnp.Tokenizer.tiny()
    model = pnp.LlamaModel.random(pnp.ModelConfig(vocab_size=tok.vocab_size), seed=0)
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Hello there"}]))
    ids = model.dense_generate(prompt, 6, tok.stop_token_ids)
    first = text.split("bot> ", 1)[1].split("\n[reused", 1)[0]
    assert first == tok.decode(ids).rstrip("\ufffd")


def test_chat_reset_and_end_of_input():
    out = io.StringIO()
    stdin = io.StringIO("Hi\n/reset\nHi\n")                      # ends without /exit
    assert chat.main(["--model", "tiny", "--max-tokens", "3", "--backend", "numpy"],
                     stdin=stdin, stdout=out) == 0
    text = out.getvalue()
    assert "(new conversation)" in text and text.count("[reused") == 2


def test_endless_chat_outgrows_the_arena_and_the_positions_with_flat_pages():
    """--sliding-window --attention-sinks: the conversation passes the arena (96 slots)
    and the tiny model's 2,048 positions; no turn holds more than its window's pages."""
    out = io.StringIO()
    turns = "".join(f"Tell me more, part {i}\n" for i in range(10)) + "/exit\n"
    assert chat.main(["--model", "tiny", "--max-tokens", "240", "--backend", "numpy",
                      "--sliding-window", "64", "--attention-sinks", "4", "--num-pages", "12",
                      "--page-size", "8", "--max-num-batched-tokens", "32"],
                     stdin=io.StringIO(turns), stdout=out) == 0
    found = re.findall(r"context ([\d,]+) tokens, at most (\d+) pages in use", out.getvalue())
    assert len(found) == 10
    contexts = [int(c.replace(",", "")) for c, _ in found]
    assert contexts[-1] > 2048 > 96 and contexts == sorted(contexts)
    # the sink page, the window's 8 pages plus a chunk of 32 tokens, one page of slack
    assert max(int(p) for _, p in found) <= 1 + (64 + 32) // 8 + 1


def test_a_resumed_chat_reads_its_earlier_turns_back_from_disk(tmp_path):
    flags = ["--model", "tiny", "--max-tokens", "4", "--backend", "numpy",
             "--disk-cache-dir", str(tmp_path)]
    first = io.StringIO()
    long_turn = "Tell me everything about pages, block tables and prefix caching, please."
    assert chat.main(flags, stdin=io.StringIO(long_turn + "\n/exit\n"), stdout=first) == 0
    assert (tmp_path / "chat.json").is_file()
    assert "0 from disk" in first.getvalue()                 # nothing there the first time
    again = io.StringIO()                                    # a new process would do the same
    assert chat.main(flags + ["--resume"], stdin=io.StringIO("And then?\n/exit\n"),
                     stdout=again) == 0
    text = again.getvalue()
    assert "resumed a conversation of 1 turns" in text
    (reused, disk), = re.findall(r"\[reused (\d+) of \d+ prompt tokens from the cache "
                                 r"\((\d+) from disk\)", text)
    assert int(disk) > 0 and int(reused) >= int(disk)        # earlier turns, from disk
