"""The labs (paged_np/labs, labs/): every lab blank is refused "not done yet", solved is
accepted, and planted bugs are refused with the function named.

- Blank (the shipped stubs) and solved (labs/solutions/) for every lab, on the toy
  workload; ``lab all`` with every solution at once on SmolLM2 too: greedy text
  identical to the package's (the runner compares every token).
- The issue's planted bugs, one per lab: a wrong slot, a missing rescale, a partial
  page matched, a shared page written without a copy, a live page evicted, the
  oldest preempted, a finished sequence's pages never freed; and more (LRU's
  tie-break, a body without ``return``, a dense state, admitting after a preemption,
  two draws for one token).
- The messages: every part of a mismatch shown, hints only on request, the CLI's
  exit status, nothing left in a registry after a run.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import paged_np as pnp
from paged_np import registry
from paged_np.labs import LABS, run
from paged_np.labs.runner import lab_module

ROOT = Path(__file__).resolve().parent.parent
STUBS = ROOT / "labs"
SOLVED = STUBS / "solutions"


def stub(name: str) -> Path:
    return STUBS / lab_module(name).FILE


def solution(name: str) -> Path:
    return SOLVED / lab_module(name).FILE


def planted(tmp_path, name: str, old: str, new: str) -> Path:
    """The lab's solution with one bug planted (``old`` replaced by ``new``)."""
    text = solution(name).read_text()
    assert old in text, f"the planted bug's anchor is not in {solution(name)}: {old!r}"
    path = tmp_path / lab_module(name).FILE
    path.write_text(text.replace(old, new))
    return path


@pytest.fixture(scope="module")
def smollm2():
    try:
        return pnp.load_model("smollm2-135m-instruct")
    except pnp.ModelFetchError as e:
        pytest.fail(f"lab all needs SmolLM2-135M-Instruct: {e}")


@pytest.fixture(autouse=True)
def registries_left_clean():
    yield
    left = [(option, n) for option, reg in registry.REGISTRIES.items() for n in reg
            if n.startswith("_lab")]
    assert not left, f"a lab left its pieces registered: {left}"


# ------------------------------------------------------------ blank and solved
@pytest.mark.parametrize("name", list(LABS))
def test_a_blank_lab_is_not_done_yet(name):
    r = run(name, stub(name), smollm2=None, seed=0)
    assert r.status == "not done yet" and not r.ok
    assert "not done yet" in r.message
    for fn in lab_module(name).FUNCTIONS:
        assert fn in r.message


@pytest.mark.parametrize("name", list(LABS))
def test_a_solved_lab_is_accepted(name):
    r = run(name, solution(name), smollm2=None, seed=0)
    assert r.ok, r.message
    assert "accepted" in r.message


def test_all_solutions_at_once_serve_smollm2_as_the_package_does(smollm2):
    r = run("all", SOLVED, smollm2=smollm2, seed=0)
    assert r.ok, r.message
    assert "SmolLM2" in r.message


def test_all_names_the_one_piece_that_is_wrong(tmp_path):
    for name in LABS:
        shutil.copy(solution(name), tmp_path / lab_module(name).FILE)
    planted(tmp_path, "scheduler", "victim = running[-1]", "victim = running[0]")
    r = run("all", tmp_path, smollm2=None, seed=0)
    assert r.status == "not right yet"
    assert "function: make_room" in r.message and "06_scheduler.py" in r.message


# --------------------------------------------------------------- planted bugs
BUGS = {  # id: (lab, old, new, the function named, a phrase of the refusal)
    "a wrong slot": (
        "slots", "return pages * page_size + positions % page_size",
        "return pages + positions % page_size", "slot_mapping", "expected"),
    "a missing rescale": (
        "attention", "alpha * l + p.sum(axis=1), alpha[:, None] * acc + p @ v_page",
        "l + p.sum(axis=1), acc + p @ v_page", "attend_page", "after page"),
    "a partial page matched": (
        "prefix",
        "for i in range((len(token_ids) - 1) // page_size):",
        "for i in range(-(-(len(token_ids) - 1) // page_size)):", "match_prefix",
        "the last prompt token is always computed"),
    "a shared page written without a copy": (
        "cow", "first = start // page_size", "first = -(-start // page_size)",
        "pages_to_copy", "written without a copy"),
    "a live page evicted": (
        "eviction", "idle = [e for e in entries if ref_count(e.page_id) == 0]",
        "idle = list(entries)", "choose_victim", "a live page evicted"),
    "the oldest preempted": (
        "scheduler", "victim = running[-1]", "victim = running[0]", "make_room",
        "the package preempts the newest"),
    "a finished sequence's pages never freed": (
        "step", "engine.finish_sample(req.parent.request_id, req.sample.index, reason)",
        "req.sample.finish_reason = reason", "step", "still holds pages"),
    # more than the list
    "LRU's tie-break missing": (
        "eviction", "return (entry.hit_count, entry.last_access_time)",
        "return entry.hit_count", "priority", "a tie"),
    "a body without return": (
        "slots", "return free_list.pop()", "free_list.pop()", "allocate", "returned None"),
    "a state that keeps the pages": (
        "attention", "return m_new, alpha * l", "return m_new, [k_page] * len(m), alpha * l",
        "attend_page", "second pass"),
    "admitting after a preemption": (
        "scheduler", "if preempted:", "if False:", "admit",
        "in a step that preempted"),
    "two draws for one token": (
        "sampler", "u = rng.random()", "u = rng.random() * 0 + rng.random()", "sample",
        "exactly one number"),
    "top-p stops one token short": (
        "sampler", "np.cumsum(p[order]), top_p)) + 1", "np.cumsum(p[order]), top_p))",
        "probabilities", "expected"),
    "a copy after the drop": (
        "cow", "    copy_page(src, dst)          # the K/V first, while the shared page is "
               "still held\n    block_table[i] = dst         # this sequence reads and writes "
               "its copy from now on\n    drop(src) ",
        "    drop(src)\n    block_table[i] = dst\n    copy_page(src, dst) ",
        "copy_on_write", "before copying it"),
}


@pytest.mark.parametrize("bug", list(BUGS))
def test_a_planted_bug_is_refused_with_its_function_named(tmp_path, bug):
    lab, old, new, function, phrase = BUGS[bug]
    r = run(lab, planted(tmp_path, lab, old, new), smollm2=None, seed=0)
    assert r.status == "not right yet", r.message
    assert f"function: {function} " in r.message, r.message
    assert phrase in r.message, r.message
    assert "how:" not in r.message                # the code only on request


# ------------------------------------------------------------------ messages
def test_every_part_of_a_mismatch_is_shown_and_hints_come_in_tiers(tmp_path):
    lab, old, new, _, _ = BUGS["a missing rescale"]
    path = planted(tmp_path, lab, old, new)
    first = run(lab, path, smollm2=None, seed=0).message
    assert "part 0 returned" in first and "part 1 returned" in first  # out and lse
    assert "..." not in first                                          # nothing cut
    assert "--hint 2" in first and "idea:" not in first
    second = run(lab, path, smollm2=None, seed=0, hint=2).message
    assert "idea:" in second and "how:" not in second and "--hint 3" in second
    third = run(lab, path, smollm2=None, seed=0, hint=3).message
    assert "idea:" in third and "how:" in third


def test_an_error_in_the_learners_code_is_named_with_its_line(tmp_path):
    path = planted(tmp_path, "prefix", "hit = [p for p,", "hit = [p / 0 for p,")
    r = run("prefix", path, smollm2=None, seed=0)
    assert "raised ZeroDivisionError" in r.message and "03_prefix.py line" in r.message


def test_the_command_exits_0_only_when_accepted(tmp_path, capsys):
    from paged_np.__main__ import main

    assert main(["lab", "slots", "--solution", str(stub("slots")), "--no-smollm2"]) == 1
    assert "not done yet" in capsys.readouterr().out
    assert main(["lab", "slots", "--solution", str(solution("slots")), "--no-smollm2",
                 "--seed", "1"]) == 0
    assert "accepted" in capsys.readouterr().out
    assert main(["lab", "slots", "--solution", str(tmp_path / "nope.py")]) == 2
