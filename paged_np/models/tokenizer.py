"""Text in, token ids out, and back: the tokenizer of a real checkpoint.

The model only ever sees integers. :class:`Tokenizer` turns text into those
integers and back, and renders a conversation into one prompt string through
the checkpoint's own chat template. It wraps a Hugging Face ``tokenizers``
object (the Rust library vLLM and transformers use), so encodings are the
checkpoint's own, byte for byte.

Three ways to build one:

- :meth:`Tokenizer.from_gguf_fields`: from the vocabulary, merges and token
  types stored in a GGUF file (llama.cpp's format keeps the tokenizer inside
  the model file);
- :meth:`Tokenizer.from_hf_dir`: from a Hugging Face directory
  (``tokenizer.json``, plus ``tokenizer_config.json`` for the chat template
  and the special tokens);
- :meth:`Tokenizer.tiny`: a small byte-level BPE built in memory, with a ChatML
  template, for fast tests with the small random model.

Byte-level BPE in one paragraph: text is first split into "words" (the
pre-tokenizer: SmolLM2 puts every digit on its own, then uses GPT-2's
regex), each word's UTF-8 bytes are mapped to 256 printable stand-in
characters (so a space becomes ``Ġ``), and merges, applied in rank order,
glue adjacent pieces into longer vocabulary entries. Any byte string can be
encoded (there is no unknown token), and one token may hold *part* of a
multi-byte character: that is why streaming text needs
:class:`IncrementalDetokenizer`.

Compared with vLLM: one tokenizer per model, no tokenizer pool, no
``tokenizer_mode``; only byte-level BPE tokenizers are built from GGUF.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime
from pathlib import Path

from ..checks import check_int
from ..errors import ChatTemplateError, DTypeError, InvalidArgument, ModelLoadError

# Token names that end a turn in the common chat formats (ChatML, Llama 3, Gemma):
# generation stops at any of them that the vocabulary holds, besides EOS.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>",
                      "<end_of_turn>", "</s>")

# GGUF's token types (llama.cpp's enum): 3 marks a control token such as <|im_start|>.
GGUF_TOKEN_TYPE_CONTROL = 3

# The ChatML template of Tokenizer.tiny(): the same shape as SmolLM2's, with a
# default system turn when the conversation does not open with one.
TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a tiny test model.<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Text the tiny tokenizer learns its merges from (any English will do).
_TINY_CORPUS = (
    "The paged cache keeps the keys and values of every token in fixed-size pages. "
    "A block table maps the positions of a sequence to the pages that hold them. "
    "When two requests share a prompt, they share the pages of that prompt too. "
    "Hello! How are you today? I am a helpful assistant, and the answer is 42.\n"
    "What is the capital of France? The capital of France is Paris.\n"
)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table from each of the 256 byte values to a printable character.

    Printable Latin-1 bytes stand for themselves; the others (control bytes,
    space, ...) are shifted to code points 256 and up, in byte order. So the
    space byte 0x20 becomes ``Ġ`` (U+0120) and newline becomes ``Ċ``.
    """
    keep = (set(range(ord("!"), ord("~") + 1)) | set(range(ord("¡"), ord("¬") + 1))
            | set(range(ord("®"), ord("ÿ") + 1)))
    table, shifted = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + shifted)
            shifted += 1
    return table


def _pre_tokenizer(pre: str):
    """The ``tokenizers`` pre-tokenizer for a GGUF ``tokenizer.ggml.pre`` name."""
    from tokenizers import pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":
        # llama.cpp's "smollm": every digit alone, then GPT-2's regex split.
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        byte_level])
    if pre in ("default", "gpt2", "gpt-2"):
        return byte_level
    raise ModelLoadError(
        f"tokenizer: pre-tokenizer {pre!r} is not supported (known: 'smollm', 'gpt2'); "
        "load the model from a Hugging Face directory whose tokenizer.json describes it")


def _byte_level_bpe(vocab: dict[str, int], merges: list[tuple[str, str]], pre: str,
                    special_tokens: list[str]):
    """A ``tokenizers.Tokenizer``: byte-level BPE with the given vocab, merges, specials."""
    from tokenizers import AddedToken, decoders, models
    from tokenizers import Tokenizer as HFTokenizer

    tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False,
                                 byte_fallback=False))
    tok.pre_tokenizer = _pre_tokenizer(pre)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False)
                            for s in special_tokens])
    return tok


def _learn_merges(text: str, alphabet: list[str], pre_tokenizer, num_merges: int):
    """Greedy BPE training on ``text`` (ties broken by the pair itself: deterministic)."""
    words = Counter(w for w, _ in pre_tokenizer.pre_tokenize_str(text))
    pieces = {w: list(w) for w in words}
    merges, known = [], set(alphabet)
    while len(merges) < num_merges:
        pairs: Counter = Counter()
        for w, n in words.items():
            p = pieces[w]
            for a, b in zip(p, p[1:]):
                pairs[(a, b)] += n
        if not pairs:
            break
        best = min(pairs, key=lambda ab: (-pairs[ab], ab))       # most frequent, then smallest
        merges.append(best)
        known.add(best[0] + best[1])
        for w in words:
            p, out, i = pieces[w], [], 0
            while i < len(p):
                if i + 1 < len(p) and (p[i], p[i + 1]) == best:
                    out.append(p[i] + p[i + 1])
                    i += 2
                else:
                    out.append(p[i])
                    i += 1
            pieces[w] = out
    return merges


class Tokenizer:
    """A checkpoint's tokenizer: ``encode``, ``decode``, ``apply_chat_template``.

    Attributes
    ----------
    eos_token_id : int
        The end-of-sequence id (for SmolLM2, ``<|im_end|>`` = 2).
    bos_token_id : int or None
    vocab_size : int
        Number of ids, special tokens included.
    chat_template : str or None
        The checkpoint's Jinja template, rendered by :meth:`apply_chat_template`.
    stop_token_ids : tuple of int
        EOS and the other end-of-turn ids the vocabulary holds.

    Example
    -------
    >>> tok = Tokenizer.tiny()
    >>> tok.decode(tok.encode("Hello, world!"))
    'Hello, world!'
    """

    def __init__(self, hf_tokenizer, *, eos_token_id: int, bos_token_id: int | None = None,
                 chat_template: str | None = None, stop_token_ids=None,
                 special_tokens_map: dict | None = None):
        self._tok = hf_tokenizer
        self.vocab_size = int(hf_tokenizer.get_vocab_size(with_added_tokens=True))
        for name, value in (("eos_token_id", eos_token_id), ("bos_token_id", bos_token_id)):
            if value is None and name == "bos_token_id":
                continue
            if not (0 <= int(value) < self.vocab_size):
                raise ModelLoadError(f"tokenizer: {name}={value} is outside the vocabulary "
                                     f"[0, {self.vocab_size})")
        self.eos_token_id = int(eos_token_id)
        self.bos_token_id = None if bos_token_id is None else int(bos_token_id)
        self.chat_template = chat_template
        if stop_token_ids is None:
            stops = [self.eos_token_id]
            for name in END_OF_TURN_TOKENS:
                i = hf_tokenizer.token_to_id(name)
                if i is not None and i not in stops:
                    stops.append(int(i))
            stop_token_ids = stops
        self.stop_token_ids = tuple(int(i) for i in stop_token_ids)
        # Names the chat template may use ({{ bos_token }}, {{ eos_token }}).
        self.special_tokens_map = dict(special_tokens_map or {})
        self.special_tokens_map.setdefault("eos_token", self.id_to_token(self.eos_token_id))
        if self.bos_token_id is not None:
            self.special_tokens_map.setdefault("bos_token", self.id_to_token(self.bos_token_id))
        self._template = None                                    # compiled on first use

    # ------------------------------------------------------------ encode / decode
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Text -> token ids. Special tokens written in the text (``<|im_start|>``) map
        to their ids; ``add_special_tokens`` adds what the checkpoint adds (e.g. BOS)."""
        if not isinstance(text, str):
            raise DTypeError(f"text must be a str, got {type(text).__name__}")
        # encode_batch releases the GIL while it works (encode holds it), so a server
        # tokenizing a long prompt in a worker thread keeps answering other requests.
        (enc,) = self._tok.encode_batch([text], add_special_tokens=bool(add_special_tokens))
        return enc.ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        """Token ids -> text. Bytes that do not form whole characters come out as U+FFFD."""
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]      # one message, not per id
        if bad:
            raise InvalidArgument(f"ids: {bad[0]} is outside the vocabulary [0, {self.vocab_size})")
        return self._tok.decode(ids, skip_special_tokens=bool(skip_special_tokens))

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary entry of one id (byte-level stand-in characters, e.g. ``Ġthe``)."""
        return self._tok.id_to_token(int(token_id))

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return (f"Tokenizer(vocab_size={self.vocab_size}, eos_token_id={self.eos_token_id}, "
                f"bos_token_id={self.bos_token_id}, "
                f"chat_template={self.chat_template is not None})")

    # ------------------------------------------------------------ chat template
    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """Render a conversation into one prompt string with the checkpoint's template.

        ``messages`` is a list of ``{"role": ..., "content": ...}`` dicts. The
        template is rendered with Jinja2 the way transformers renders it
        (sandboxed, ``trim_blocks`` and ``lstrip_blocks``, ``loopcontrols``, a
        ``tojson`` filter and ``raise_exception``), so the prompt equals
        transformers' ``tokenizer.apply_chat_template(..., tokenize=False)``.
        """
        if self.chat_template is None:
            raise ChatTemplateError(
                "apply_chat_template: this tokenizer has no chat template; pass a plain prompt "
                "to generate(), or load a checkpoint that ships one (tokenizer.chat_template "
                "in GGUF, chat_template in tokenizer_config.json)")
        if not isinstance(messages, (list, tuple)) or not messages:
            raise InvalidArgument("messages must be a non-empty list of {'role', 'content'} dicts")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) \
                    or not isinstance(m.get("content"), str):
                raise InvalidArgument(
                    f"messages[{i}] must be a dict with str 'role' and 'content', got {m!r}")
        if self._template is None:
            self._template = _compile_template(self.chat_template)
        try:
            return self._template.render(messages=list(messages),
                                         add_generation_prompt=bool(add_generation_prompt),
                                         **self.special_tokens_map)
        except ChatTemplateError:
            raise
        except Exception as e:                                   # jinja2's own errors
            raise ChatTemplateError(f"apply_chat_template: the template failed: {e}") from e

    # ------------------------------------------------------------ constructors
    @classmethod
    def from_gguf_fields(cls, tokens: list[str], token_types: list[int], merges: list[str], *,
                         model: str, pre: str, eos_token_id: int, bos_token_id: int | None,
                         add_bos_token: bool = False, chat_template: str | None = None
                         ) -> Tokenizer:
        """Build from the ``tokenizer.ggml.*`` fields of a GGUF file.

        ``tokens[i]`` is id ``i``'s string; ``merges`` are ``"a b"`` strings in
        rank order; token type 3 marks control tokens (added as special tokens
        so that ``<|im_start|>`` in text encodes to its single id).
        """
        if model != "gpt2":
            raise ModelLoadError(
                f"tokenizer: GGUF tokenizer model {model!r} is not supported (only byte-level "
                "BPE, 'gpt2'); load the model from a Hugging Face directory instead")
        if len(tokens) != len(token_types):
            raise ModelLoadError(f"tokenizer: {len(tokens)} tokens but {len(token_types)} types")
        vocab = {t: i for i, t in enumerate(tokens)}
        pairs = [tuple(m.split(" ", 1)) for m in merges]
        specials = [t for t, ty in zip(tokens, token_types) if ty == GGUF_TOKEN_TYPE_CONTROL]
        hf = _byte_level_bpe(vocab, pairs, pre, specials)
        if add_bos_token and bos_token_id is not None:
            from tokenizers import processors

            bos = tokens[bos_token_id]
            hf.post_processor = processors.TemplateProcessing(
                single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                special_tokens=[(bos, bos_token_id)])
        return cls(hf, eos_token_id=eos_token_id, bos_token_id=bos_token_id,
                   chat_template=chat_template)

    @classmethod
    def from_hf_dir(cls, path) -> Tokenizer:
        """Build from a Hugging Face model directory.

        Reads ``tokenizer.json`` (the whole tokenizer, through ``tokenizers``),
        and from ``tokenizer_config.json`` the chat template and the names of
        the BOS/EOS tokens; ``generation_config.json``'s ``eos_token_id`` (an
        int or a list) adds stop ids.
        """
        from tokenizers import Tokenizer as HFTokenizer

        path = Path(path)
        tj = path / "tokenizer.json"
        if not tj.is_file():
            raise ModelLoadError(f"{path}: no tokenizer.json; copy the checkpoint's tokenizer.json "
                                 "into this directory")
        hf = HFTokenizer.from_file(str(tj))
        cfg = _read_json(path / "tokenizer_config.json")
        template = cfg.get("chat_template")
        if isinstance(template, list):                           # [{"name", "template"}, ...]
            named = {t.get("name"): t.get("template") for t in template}
            template = named.get("default") or next(iter(named.values()), None)
        if template is None and (path / "chat_template.jinja").is_file():
            template = (path / "chat_template.jinja").read_text()

        def token_name(key):
            v = cfg.get(key)
            return v.get("content") if isinstance(v, dict) else v

        special = {k: token_name(k) for k in ("bos_token", "eos_token", "unk_token", "pad_token")
                   if token_name(k) is not None}
        model_cfg = _read_json(path / "config.json")
        eos_name, bos_name = special.get("eos_token"), special.get("bos_token")
        eos = hf.token_to_id(eos_name) if eos_name else model_cfg.get("eos_token_id")
        bos = hf.token_to_id(bos_name) if bos_name else model_cfg.get("bos_token_id")
        if isinstance(eos, list):
            eos = eos[0]
        if eos is None:
            raise ModelLoadError(f"{path}: no EOS token: set eos_token in tokenizer_config.json")
        tok = cls(hf, eos_token_id=eos, bos_token_id=bos, chat_template=template,
                  special_tokens_map=special)
        gen_eos = _read_json(path / "generation_config.json").get("eos_token_id")
        extra = gen_eos if isinstance(gen_eos, list) else [gen_eos] if gen_eos is not None else []
        stops = list(tok.stop_token_ids) + [int(i) for i in extra]
        tok.stop_token_ids = tuple(dict.fromkeys(stops))          # in order, no repeats
        return tok

    @classmethod
    def tiny(cls, vocab_size: int = 320) -> Tokenizer:
        """A small byte-level BPE with a ChatML template, built in memory in milliseconds.

        Ids: 0 ``<|endoftext|>``, 1 ``<|im_start|>`` (BOS), 2 ``<|im_end|>``
        (EOS), then the 256 bytes, then merges learned from a few English
        sentences up to ``vocab_size`` (at least 259). Pair it with
        ``ModelConfig(vocab_size=tok.vocab_size)``. Same pre-tokenizer as
        SmolLM2, so it round-trips any text.
        """
        vocab_size = check_int("vocab_size", vocab_size, low=259)  # 3 specials + 256 bytes
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        alphabet = list(bytes_to_unicode().values())             # in byte order
        merges = _learn_merges(_TINY_CORPUS, alphabet, _pre_tokenizer("smollm"),
                               vocab_size - len(specials) - len(alphabet))
        tokens = specials + alphabet + [a + b for a, b in merges]
        if len(tokens) != vocab_size:
            raise InvalidArgument(f"vocab_size={vocab_size}: the tiny corpus only supports "
                                  f"{len(tokens)} tokens")
        hf = _byte_level_bpe({t: i for i, t in enumerate(tokens)}, merges, "smollm", specials)
        return cls(hf, eos_token_id=2, bos_token_id=1, chat_template=TINY_CHAT_TEMPLATE)


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{path}: not valid JSON ({e})") from e


def _compile_template(source: str):
    """Compile a chat template the way transformers does (sandboxed Jinja2)."""
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise ChatTemplateError(f"apply_chat_template: the template refused: {message}")

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"chat_template: not a valid Jinja template: {e}") from e


class IncrementalDetokenizer:
    """Turn a stream of token ids into a stream of text, one token at a time.

    One token may carry half of a multi-byte character (an emoji is 4 bytes,
    often 2 tokens). Decoding the new token alone would print U+FFFD; so
    :meth:`push` decodes a short window of recent tokens and returns only the
    text that became *complete*, holding back while the window's text ends in
    an unfinished character. This is vLLM's ``prefix_offset`` /
    ``read_offset`` scheme: text before ``read_offset`` has been returned
    already; the window starts at ``prefix_offset`` so that a token's leading
    space (SentencePiece style) decodes the same as in context.

    Example
    -------
    >>> tok = Tokenizer.tiny()
    >>> d = IncrementalDetokenizer(tok)
    >>> "".join(d.push(i) for i in tok.encode("café 🙂")) == "café 🙂" == d.text
    True
    """

    def __init__(self, tokenizer: Tokenizer, prompt_ids=(), skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = [int(i) for i in prompt_ids]
        # A few prompt tokens of context, as vLLM does, none of them returned.
        self.read_offset = len(self.ids)
        self.prefix_offset = max(self.read_offset - 5, 0)
        self.text = ""

    def push(self, token_id: int) -> str:
        """Add one generated token; return the newly completed text (maybe ``""``)."""
        self.ids.append(int(token_id))
        dec = self.tokenizer.decode
        prefix = dec(self.ids[self.prefix_offset:self.read_offset], self.skip_special_tokens)
        full = dec(self.ids[self.prefix_offset:], self.skip_special_tokens)
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            delta = full[len(prefix):]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            self.text += delta
            return delta
        return ""                                                # wait for the rest of the bytes
