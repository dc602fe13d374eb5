"""Batch-1 decode of SmolLM2-135M-Instruct: tokens/s, the weight-streaming bound, transformers.

    python benchmarks/model_decode.py [--threads 1 2] [--rounds 3] [--no-peer]

Writes ``benchmarks/model_decode.md``. The measurement functions live in
:mod:`paged_np.cli.bench_model` (``measure_decode(model, ...) -> dict``), so
``python -m paged_np bench --model ...`` can call them too. The transformers
column appears when torch and transformers are installed
(``pip install torch==2.13.0 transformers accelerate``).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # this checkout's paged_np

from paged_np.cli.bench_model import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] + ["--out", str(Path(__file__).parent)]))
