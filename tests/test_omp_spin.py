"""``import paged_np`` leaves GNU OpenMP's spin alone (benchmarks/omp_spin.md says why: once
the quantized model stopped calling BLAS, libgomp's default measured faster than the shorter
spin the package used to set)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CODE = "import os, paged_np; print(os.environ.get('GOMP_SPINCOUNT', 'unset'))"


@pytest.mark.parametrize("given, expected", [(None, "unset"), ("12345", "12345")])
def test_import_leaves_gomp_spincount_as_the_user_set_it(given, expected):
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    if given is not None:
        env["GOMP_SPINCOUNT"] = given
    out = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == expected
