"""The capstone's checker (``notebooks/capstone/check.py``): blank, passing and failing
policies give the verdicts and exit statuses it promises (``--quick``: seconds)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CAPSTONE = ROOT / "notebooks" / "capstone"


def _checker():
    spec = importlib.util.spec_from_file_location("capstone_check", CAPSTONE / "check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _policy(tmp_path, body: str, words: int = 0) -> Path:
    path = tmp_path / "pol.py"
    path.write_text("import random\n\nimport paged_np as pnp\n\n\n"
                    "class P(pnp.EvictionPolicy):\n    name = 'p'\n\n"
                    f"    def priority(self, entry):\n        {body}\n")
    if words:
        (tmp_path / "WHEN_IT_LOSES.md").write_text("word " * words)
    return path


def test_the_shipped_template_is_blank(capsys):
    assert _checker().main([str(CAPSTONE / "my_policy.py"), "--quick"]) == 2
    assert "not done yet" in capsys.readouterr().out


def test_a_sound_policy_with_its_page_passes(tmp_path, capsys):
    path = _policy(tmp_path, "return (min(entry.hit_count, 2), entry.last_access_time)", 200)
    assert _checker().main([str(path), "--quick"]) == 0
    out = capsys.readouterr().out
    assert "PASS   randomized (hash)" in out and "PASS   randomized (radix)" in out
    assert "REPORT simulation system" in out and "LRU" in out
    assert out.strip().endswith("all checks passed")


def test_an_impure_policy_and_a_missing_page_fail(tmp_path, capsys):
    path = _policy(tmp_path, "return random.random()")
    assert _checker().main([str(path), "--quick"]) == 1
    out = capsys.readouterr().out
    assert "FAIL   pure priority" in out and "FAIL   write-up" in out


def test_keys_that_do_not_sort_fail(tmp_path, capsys):
    path = _policy(tmp_path, "return {'t': entry.last_access_time}", 200)
    ck = _checker()
    assert ck.check_pure(ck.load_policy(path, None)()) is True
    assert "FAIL   pure priority: the keys do not sort" in capsys.readouterr().out
