"""Record SmolLM2-135M-Instruct's golden outputs from Hugging Face transformers.

Run by hand, in the comparison environment (never in CI)::

    pip install torch==2.13.0 transformers accelerate
    python tests/data/make_golden.py          # writes tests/data/smollm2_golden.json

The reference must be the *same weights* paged_np runs: the Q4_1 GGUF,
dequantized to float32. The hub is not reachable here, so this script reads
the GGUF with paged_np's loader, writes it as a Hugging Face directory
(``paged_np.models.hf.save_hf``: float32 safetensors, config.json,
tokenizer.json) in a temporary folder, and loads that with transformers'
``LlamaForCausalLM`` (eager attention, float32, 2 threads). Since the loader
undoes the GGUF's Q/K permutation, transformers' own rotate-half RoPE checks
that step too.

Recorded per prompt: the prompt text transformers' ``apply_chat_template``
renders and its ids, the greedy continuation (``generate``,
``do_sample=False``, stops at EOS), and the logits at the prompt's last
position for the 100 highest ids and every 97th id (``test_models_real.py``
compares within 2e-4).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about memory pages.",
    "List three prime numbers.",
]
MAX_NEW_TOKENS = 32
STRIDE = 97
TOP = 100


def main() -> None:
    import torch
    import transformers
    from transformers import AutoTokenizer, LlamaForCausalLM

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from paged_np.models.gguf import load_gguf
    from paged_np.models.hf import save_hf
    from paged_np.models.hub import fetch_model

    torch.set_num_threads(2)
    cfg, weights, tok = load_gguf(fetch_model("smollm2-135m-instruct"))
    weights["lm_head"] = weights["embed"].T                      # tied: save_hf skips it
    with tempfile.TemporaryDirectory() as tmp:
        save_hf(tmp, cfg, weights, tok)
        hf_tok = AutoTokenizer.from_pretrained(tmp)
        model = LlamaForCausalLM.from_pretrained(tmp, torch_dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    records = []
    for text in PROMPTS:
        messages = [{"role": "user", "content": text}]
        prompt = hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = hf_tok(prompt, add_special_tokens=False)["input_ids"]
        x = torch.tensor([ids])
        with torch.no_grad():
            logits = model(x).logits[0, -1].numpy().astype(np.float32)      # [V]
            out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                                 max_new_tokens=MAX_NEW_TOKENS, eos_token_id=tok.eos_token_id,
                                 pad_token_id=tok.eos_token_id)
        gen = out[0, len(ids):].tolist()
        top = set(np.argsort(-logits)[:TOP].tolist())
        picked = sorted(top | set(range(0, len(logits), STRIDE)))
        records.append({
            "messages": messages, "prompt": prompt, "prompt_ids": ids,
            "greedy_ids": gen, "greedy_text": hf_tok.decode(gen, skip_special_tokens=True),
            "logit_ids": picked, "logits": [float(logits[i]) for i in picked],
        })
        print(f"{text!r} -> {records[-1]['greedy_text']!r}")
    golden = {
        "model": "smollm2-135m-instruct (SmolLM2-135M-Instruct.Q4_1.gguf dequantized to float32)",
        "transformers": transformers.__version__, "torch": torch.__version__,
        "max_new_tokens": MAX_NEW_TOKENS, "records": records,
    }
    out_path = Path(__file__).with_name("smollm2_golden.json")
    out_path.write_text(json.dumps(golden, indent=1) + "\n")
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
