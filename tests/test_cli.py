"""The command line: every subcommand it lists exists, and info reports the backends."""

import subprocess
import sys

import pytest

from paged_np.__main__ import COMMANDS, main


def run(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "paged_np", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_info_lists_backends_with_reasons():
    r = run("info")
    assert r.returncode == 0, r.stderr
    for name in ("numpy", "numba", "cuda"):
        assert f"  {name}" in r.stdout
    assert "numpy  available" in r.stdout


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_subcommand_has_help(name):
    r = run(name, "--help")
    assert r.returncode == 0, r.stderr
    assert "usage" in r.stdout.lower()


def test_unknown_command_is_refused(capsys):
    assert main(["nope"]) == 2
    assert "unknown command" in capsys.readouterr().err
