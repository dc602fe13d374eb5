"""The tokenizer: round trips, Hugging Face directories, chat templates, streaming text."""

import json

import pytest

from paged_np.errors import ChatTemplateError, InvalidArgument, ModelLoadError
from paged_np.models.tokenizer import (
    TINY_CHAT_TEMPLATE,
    IncrementalDetokenizer,
    Tokenizer,
    bytes_to_unicode,
)

TEXTS = [
    "Hello, world!",
    "0123456789 and 3.14159, 1e-5",
    "two  spaces,   three,    four\n\nnewlines\n\n\n\tand a tab",
    "   leading and trailing   ",
    "café, naïve, façade, Ærøskøbing, ß",
    "日本語のテキスト、中文文本",
    "emoji 🙂👍🏽 family 👨‍👩‍👧 flags 🇫🇷",
    "<|im_start|>user\nhi<|im_end|>\n",
    "",
]


@pytest.fixture(scope="module")
def tiny():
    return Tokenizer.tiny()


def test_bytes_to_unicode_is_a_bijection_on_printables():
    table = bytes_to_unicode()
    assert sorted(table) == list(range(256))
    assert len(set(table.values())) == 256
    assert table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ" and table[ord("a")] == "a"
    assert all(c.isprintable() for c in table.values())


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tiny, text):
    ids = tiny.encode(text)
    assert all(0 <= i < tiny.vocab_size for i in ids)
    assert tiny.decode(ids, skip_special_tokens=False) == text


def test_special_tokens_in_text_map_to_their_ids(tiny):
    ids = tiny.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == tiny.bos_token_id == 1 and ids[-1] == tiny.eos_token_id == 2
    assert tiny.decode(ids) == "user\nhi"                        # specials skipped by default


def test_digits_are_split_one_by_one(tiny):
    # SmolLM2's pre-tokenizer: each digit is its own word, so "1234" is 4 tokens.
    assert tiny.encode("1234") == [tiny.token_to_id(d) for d in "1234"]


def test_tiny_layout_and_stop_ids(tiny):
    assert tiny.vocab_size == 320
    assert tiny.stop_token_ids == (2, 0)                         # <|im_end|>, <|endoftext|>
    assert len(Tokenizer.tiny(300)) == 300
    with pytest.raises(InvalidArgument, match="vocab_size"):
        Tokenizer.tiny(100)


def test_from_hf_dir_equals_tokenizer_json(tmp_path, tiny):
    from tokenizers import Tokenizer as HFTokenizer

    tiny._tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"},
        "chat_template": TINY_CHAT_TEMPLATE}))
    tok = Tokenizer.from_hf_dir(tmp_path)
    ref = HFTokenizer.from_file(str(tmp_path / "tokenizer.json"))
    for text in TEXTS:
        assert tok.encode(text) == ref.encode(text, add_special_tokens=False).ids
        assert tok.encode(text) == tiny.encode(text)
    assert (tok.eos_token_id, tok.bos_token_id) == (2, 1)
    msgs = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(msgs) == tiny.apply_chat_template(msgs)


def test_from_hf_dir_without_tokenizer_json_names_the_file(tmp_path):
    with pytest.raises(ModelLoadError, match="tokenizer.json"):
        Tokenizer.from_hf_dir(tmp_path)


def test_chat_template_renders_chatml(tiny):
    msgs = [{"role": "user", "content": "What is 2+2?"}]
    assert tiny.apply_chat_template(msgs) == (
        "<|im_start|>system\nYou are a tiny test model.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
    with_system = [{"role": "system", "content": "Be brief."}] + msgs
    out = tiny.apply_chat_template(with_system, add_generation_prompt=False)
    assert out == ("<|im_start|>system\nBe brief.<|im_end|>\n"
                   "<|im_start|>user\nWhat is 2+2?<|im_end|>\n")


def test_chat_template_matches_transformers_options():
    # trim_blocks / lstrip_blocks, loopcontrols, tojson, raise_exception: as transformers.
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models

    template = ("{% for m in messages %}\n  {% if loop.index > 1 %}{% break %}{% endif %}\n"
                "{{ m['content'] | tojson }}\n{% endfor %}"
                "{% if add_generation_prompt %}{{ raise_exception('no') }}{% endif %}")
    hf = HFTokenizer(models.BPE(vocab={"a": 0}, merges=[]))
    tok = Tokenizer(hf, eos_token_id=0, chat_template=template)
    msgs = [{"role": "user", "content": "é\n"}, {"role": "user", "content": "x"}]
    assert tok.apply_chat_template(msgs, add_generation_prompt=False) == '"é\\n"\n'
    with pytest.raises(ChatTemplateError, match="no"):
        tok.apply_chat_template(msgs)


@pytest.mark.parametrize("bad", [[], "hi", [{"role": "user"}], [{"role": 1, "content": "x"}]])
def test_chat_template_rejects_bad_messages(tiny, bad):
    with pytest.raises(InvalidArgument, match="messages"):
        tiny.apply_chat_template(bad)


def test_no_template_is_a_clear_error():
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models

    tok = Tokenizer(HFTokenizer(models.BPE(vocab={"a": 0}, merges=[])), eos_token_id=0)
    with pytest.raises(ChatTemplateError, match="no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "x"}])


def test_decode_rejects_ids_outside_the_vocabulary(tiny):
    with pytest.raises(InvalidArgument, match="ids"):
        tiny.decode([1, tiny.vocab_size])


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_detokenizer_never_splits_a_character(tiny, text):
    ids = tiny.encode(text)
    d = IncrementalDetokenizer(tiny, skip_special_tokens=False)
    pieces = [d.push(i) for i in ids]
    assert "".join(pieces) == d.text == text
    assert not any("\ufffd" in p for p in pieces)


def test_incremental_detokenizer_holds_back_partial_bytes(tiny):
    ids = tiny.encode("🙂")                                      # 4 bytes, 4 byte tokens here
    assert len(ids) > 1
    d = IncrementalDetokenizer(tiny)
    assert [d.push(i) for i in ids] == [""] * (len(ids) - 1) + ["🙂"]


def test_incremental_detokenizer_after_a_prompt(tiny):
    prompt = tiny.encode("Say: ")
    answer = tiny.encode("naïve 日本")
    d = IncrementalDetokenizer(tiny, prompt_ids=prompt)
    assert "".join(d.push(i) for i in answer) == tiny.decode(answer) == "naïve 日本"
