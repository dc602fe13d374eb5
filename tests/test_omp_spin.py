"""``import paged_np`` shortens GNU OpenMP's spin (benchmarks/omp_spin.md says why), unless
the user chose one."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CODE = "import os, paged_np; print(os.environ['GOMP_SPINCOUNT'])"


@pytest.mark.parametrize("given, expected", [(None, "30000"), ("12345", "12345")])
def test_gomp_spincount_default_and_the_users_value_wins(given, expected):
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    if given is not None:
        env["GOMP_SPINCOUNT"] = given
    out = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == expected
