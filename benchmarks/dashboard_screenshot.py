"""The README's picture of ``/dashboard``: a server, a batch of chats, one screenshot.

::

    python benchmarks/dashboard_screenshot.py            # writes docs/img/dashboard.png

Starts the tiny random model's server (96 pages of 16 tokens, the radix index so the
tree shows) on a free loopback port, opens the dashboard in headless Chromium
(``apt-get install chromium chromium-driver``; ``pip install selenium``), sends a
first batch of chats so some pages are cached, then a second batch sharing one system
prompt, and takes the screenshot while the second batch runs: pages in use coloured
by request, the system prompt's pages read by all of them, cached pages in eviction
order. The model is random, so the numbers are the cache's, not a real model's speed.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import threading
import time
from pathlib import Path

import openai
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

import paged_np as pnp
from paged_np.cli.serve import tiny_model
from paged_np.server import ServerThread

OUT = Path(__file__).resolve().parents[1] / "docs" / "img" / "dashboard.png"
SYSTEM = ("You are a patient teacher. Explain how a paged KV cache keeps keys and values "
          "in fixed-size pages, and answer in a few words.")


def chat(client, system, user, max_tokens):
    for _ in client.chat.completions.create(
            model="tiny-random", stream=True, max_tokens=max_tokens, temperature=0,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
            extra_body={"ignore_eos": True}):
        time.sleep(0.004)                              # a client reading: chats last a while


def batch(client, system, n, max_tokens):
    threads = [threading.Thread(target=chat, args=(client, system, f"Question {i}?", max_tokens))
               for i in range(n)]
    for t in threads:
        t.start()
    return threads


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--width", type=int, default=1600)
    ap.add_argument("--height", type=int, default=1000)
    args = ap.parse_args()

    model, tok = tiny_model(seed=0)
    llm = pnp.LLM(model, tokenizer=tok, num_pages=96, page_size=16, max_num_seqs=6,
                  max_num_batched_tokens=512, prefix_cache="radix", backend="numpy",
                  verbose=False)
    llm.model_name = "tiny-random"
    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    profile = tempfile.mkdtemp(prefix="paged_np-chromium-")
    for a in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--no-first-run", "--hide-scrollbars", f"--user-data-dir={profile}",
              f"--window-size={args.width},{args.height}"]:
        opts.add_argument(a)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)
    try:
        with ServerThread(llm) as srv:
            client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
            driver.get(srv.url + "/dashboard")
            for t in batch(client, "Another prompt, answered first.", 3, 40):
                t.join()                                  # leaves cached pages behind
            threads = batch(client, SYSTEM, 8, 250)     # two wait: max_num_seqs is 6
            time.sleep(2.5)                             # mid-batch
            args.out.parent.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(args.out))
            for t in threads:
                t.join()
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
