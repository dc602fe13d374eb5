"""Record transformers' log-softmax on the golden prompts and on the perplexity text.

Run by hand, in the comparison environment (never in CI)::

    python tests/data/make_logprobs_golden.py   # writes tests/data/smollm2_logprobs_golden.json

The reference is the same as ``make_golden.py``'s: the Q4_1 GGUF dequantized
to float32, written as a Hugging Face directory and run by transformers'
``LlamaForCausalLM`` (eager attention, float32, 2 threads). For each prompt
of ``smollm2_golden.json``, the sequence ``prompt + greedy continuation`` is
scored in one forward pass (teacher forcing), so the logprobs of the prompt
tokens (vLLM's ``prompt_logprobs``) and of the generated ones (``logprobs``)
both come out; recorded: each token's logprob and the 5 most likely ids with
theirs. For the perplexity text (:mod:`paged_np.engine.perplexity`, the
first ``EVAL_TOKENS`` tokens), each token's logprob, the perplexity and the
text's SHA-256.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

TOP = 5


def main() -> None:
    import torch
    import transformers
    from transformers import LlamaForCausalLM

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from paged_np.engine.perplexity import EVAL_TOKENS, eval_text_info, eval_token_ids
    from paged_np.models.gguf import load_gguf
    from paged_np.models.hf import save_hf
    from paged_np.models.hub import fetch_model

    torch.set_num_threads(2)
    cfg, weights, tok = load_gguf(fetch_model("smollm2-135m-instruct"))
    weights["lm_head"] = weights["embed"].T                      # tied: save_hf skips it
    with tempfile.TemporaryDirectory() as tmp:
        save_hf(tmp, cfg, weights, tok)
        model = LlamaForCausalLM.from_pretrained(tmp, torch_dtype=torch.float32,
                                                 attn_implementation="eager").eval()

    def log_softmax(ids):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0]        # [L, V] float32
            return torch.log_softmax(logits, dim=-1).numpy()     # [L, V]

    golden = json.loads(Path(__file__).with_name("smollm2_golden.json").read_text())
    prompts = []
    for rec in golden["records"]:
        ids = rec["prompt_ids"] + rec["greedy_ids"]
        lp = log_softmax(ids)[:-1]                               # row i scores token i + 1
        top = np.argsort(-lp, axis=-1, kind="stable")[:, :TOP]   # [L-1, TOP]
        prompts.append({
            "prompt_ids": rec["prompt_ids"], "greedy_ids": rec["greedy_ids"],
            "token_logprobs": [float(lp[i, t]) for i, t in enumerate(ids[1:])],
            "top_ids": top.tolist(),
            "top_logprobs": np.take_along_axis(lp, top, -1).astype(float).tolist(),
        })
    ids = eval_token_ids(tok, EVAL_TOKENS)
    lp = log_softmax(ids)[:-1]
    token_lp = lp[np.arange(len(ids) - 1), ids[1:]].astype(np.float64)
    text = {**eval_text_info(), "num_tokens": len(ids), "token_ids": ids,
            "token_logprobs": token_lp.tolist(),
            "perplexity": float(np.exp(-token_lp.mean()))}
    out = {"model": golden["model"], "transformers": transformers.__version__,
           "torch": torch.__version__, "top": TOP, "prompts": prompts, "text": text}
    path = Path(__file__).with_name("smollm2_logprobs_golden.json")
    path.write_text(json.dumps(out) + "\n")
    print(f"perplexity {text['perplexity']:.4f} on {len(ids)} tokens; wrote {path}")


if __name__ == "__main__":
    main()
