"""``python -m paged_np serve`` as a process: Ctrl-C and SIGTERM end it cleanly.

An in-flight stream is not cut: it ends with ``finish_reason="abort"`` (or
finishes, if it can within the drain timeout) and ``data: [DONE]``, and the
process exits with status 0.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_signal_ends_streams_and_exits_cleanly(sig):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "paged_np", "serve", "--model", "tiny-random", "--port",
         str(port), "--backend", "numpy", "--drain-timeout", "0.5", "--log-level", "warning"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not come up"
            time.sleep(0.2)

        events, started = [], threading.Event()

        def stream():
            body = {"model": "tiny-random", "prompt": "Hello", "max_tokens": 1000,
                    "temperature": 0, "stream": True}
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])
                        started.set()

        t = threading.Thread(target=stream)
        t.start()
        assert started.wait(30)
        proc.send_signal(sig)
        t.join(60)
        assert not t.is_alive()
        assert proc.wait(60) == 0
        assert events[-1] == "[DONE]"
        last = json.loads(events[-2])
        assert last["choices"][0]["finish_reason"] in ("abort", "length", "stop")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
