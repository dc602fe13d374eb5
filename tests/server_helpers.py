"""Shared pieces of the server tests: a tiny model, an LLM over it, metrics parsing, and
``serve`` run as its own process (:class:`ServeProcess`)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

import httpx

import paged_np as pnp
from paged_np.cli.serve import tiny_model

TINY_NAME = "tiny-random"


def make_llm(model, tok, num_pages=256, max_num_seqs=32, name=TINY_NAME, **kw):
    """The LLM a test server drives (numpy backend: nothing to compile)."""
    llm = pnp.LLM(model, tokenizer=tok, num_pages=num_pages, page_size=16,
                  max_num_seqs=max_num_seqs, max_num_batched_tokens=512, backend="numpy",
                  verbose=False, **kw)
    llm.model_name = name
    return llm


def tiny():
    return tiny_model(seed=0)


def reference(llm, prompt_ids, max_tokens, stop=None):
    """Greedy ``(text, finish_reason, number of tokens)`` of each prompt from ``llm.generate``."""
    params = pnp.SamplingParams(max_tokens=max_tokens, temperature=0.0, stop=stop)
    outs = llm.generate([list(p) for p in prompt_ids], params)
    return [(o.outputs[0].text, o.outputs[0].finish_reason, len(o.outputs[0].token_ids))
            for o in outs]


def chat_ids(tok, messages):
    return tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True))


_LINE = re.compile(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)$")


def metrics(url, headers=None) -> dict:
    """``GET /metrics`` as {"name{labels}": value}."""
    text = httpx.get(url + "/metrics", headers=headers, timeout=10).text
    out = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def wait_for(url, pred, timeout=20.0, headers=None):
    """Poll /metrics until ``pred(metrics)`` holds; return the last metrics."""
    deadline = time.monotonic() + timeout
    while True:
        m = metrics(url, headers)
        if pred(m) or time.monotonic() > deadline:
            return m
        time.sleep(0.05)


# ------------------------------------------------------------ `serve` as its own process
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(extra: dict | None = None) -> dict:
    """The environment of a child ``python -m paged_np``: this checkout's package first."""
    path = os.pathsep.join([ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, "PYTHONPATH": path, **(extra or {})}


class ServeProcess:
    """``python -m paged_np serve --model tiny-random`` on a free loopback port, its output
    in a file (``log()``), stopped (SIGTERM, then SIGKILL) when the ``with`` block ends.

    The child runs this checkout's package (``PYTHONPATH`` = the repository root);
    ``env`` adds variables (``PAGED_NP_API_KEY``).
    """

    def __init__(self, *args: str, env: dict | None = None, timeout: float = 120.0):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        self.cmd = [sys.executable, "-m", "paged_np", "serve", "--model", TINY_NAME,
                    "--backend", "numpy", "--port", str(self.port), *args]
        self.env = child_env(env)
        self.timeout = timeout
        self.proc = None

    def __enter__(self) -> ServeProcess:
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT, env=self.env, stdout=self._log,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError(f"serve did not answer within {self.timeout} s:\n{self.log()}")
            time.sleep(0.1)

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
        os.unlink(self._log.name)

    def log(self) -> str:
        with open(self._log.name, encoding="utf-8", errors="replace") as f:
            return f.read()

    def rss_mb(self) -> float:
        """The process's resident memory now, in MiB (Linux's /proc)."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS")
