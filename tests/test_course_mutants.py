"""The mutator of ``make mutants`` (utils/course/mutants): each kind of edit, every mutant compiles, no duplicates.
Runs no checker and no rank: the mutation scores themselves are a benchmark (make mutants), not a test."""

import ast

import pytest

from utils.checkers.labs import LABS
from utils.course.mutants import KINDS, choose, mutants, target_names
from utils.course.notebook_runner import ROOT

SOURCE = '''
import math

def answer(xs, n):
    """Docstring: never dropped."""
    total = 0
    for x in xs:
        if x < n and x != 0:
            total += x * 2
    if total > 10 or n is None:
        raise ValueError(f"total {total + 1} too large")
    return math.pow(total // n, 1)

def helper():
    return 1

def unused():
    return 2 - 1
'''


def test_each_kind_of_edit_appears_and_compiles():
    found = mutants(SOURCE, ("answer",))
    assert {m.kind for m in found} == set(KINDS)
    for m in found:
        compile(m.source, "<mutant>", "exec")
    texts = [m.source for m in found]
    assert len(texts) == len(set(texts)) and ast.unparse(ast.parse(SOURCE)) not in texts
    diffs = {m.diff for m in found}
    for expected in ("if x < n and x != 0: ...  ->  if x <= n and x != 0: ...", "x < n or x != 0", "total -= x * 2",
                     "total += x * 3", "math.pow(1, total // n)", "total / n", "line 6: total = 0  ->  (dropped)"):
        assert any(expected in d for d in diffs), (expected, sorted(diffs))


def test_messages_docstrings_and_other_functions_are_left_alone():
    found = mutants(SOURCE, ("answer",))
    assert all("Docstring" in m.source for m in found)
    assert all("total + 1" in m.source for m in found if m.kind != "dropped")  # only dropping the raise drops it
    assert all("return 2 - 1" in m.source for m in found)  # `unused` is not the answer's


def test_helpers_the_answer_calls_are_mutated_too():
    tree = ast.parse("def answer():\n    return helper()\n\ndef helper():\n    return 1\n\ndef other():\n    pass\n")
    assert target_names(tree, ("answer",)) == ["answer", "helper"]
    with pytest.raises(ValueError, match="defines none of"):
        mutants(SOURCE, ("missing",))


def test_a_lone_statement_dropped_leaves_pass():
    found = [m for m in mutants("def f(x):\n    return x + 1\n", ("f",)) if m.kind == "dropped"]
    assert len(found) == 1 and "def f(x):\n    pass" in found[0].source


def test_a_sample_is_fixed_by_its_seed_and_kept_in_order():
    found = mutants(SOURCE, ("answer",))
    first, again = choose(found, sample=5, seed=1), choose(found, sample=5, seed=1)
    assert first == again and [m.index for m in first] == sorted(m.index for m in first)
    assert choose(found, limit=3) == found[:3]


@pytest.mark.parametrize("name", sorted(LABS))
def test_every_lab_solution_has_mutants(name):
    lab = LABS[name]
    found = mutants((ROOT / "labs" / "solutions" / f"{lab.solution}.py").read_text(), lab.answers)
    assert len(found) >= 20


def test_the_readme_shows_the_recorded_scores():
    """README's table between its markers is what utils/course/mutants/scores.py writes from the recorded runs."""
    from utils.course.mutants import scores

    text = scores.README.read_text()
    assert text.count(scores.BEGIN) == 1 and text.count(scores.END) == 1
    assert scores.readme_block() in text, "README's mutation table is stale: python -m utils.course.mutants --record"


def test_a_sampled_run_is_not_recorded(tmp_path, monkeypatch):
    import json

    from utils.course.mutants import scores

    monkeypatch.setattr(scores, "SCORES", tmp_path / "scores.json")
    monkeypatch.setattr(scores, "README", tmp_path / "README.md")
    (tmp_path / "README.md").write_text(f"a\n{scores.BEGIN}\n{scores.END}\nb\n")
    run = dict(lab="06_pipeline_lab", mutants=47, tried=47, equivalent=1, named=45, unnamed=1, missed=0,
               seconds=60.0, score=1.0, named_share=45 / 46, records=[
                   dict(index=3, kind="constant", outcome="unnamed", mistake="crash", diff="x = 1  ->  x = 2")])
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "06_pipeline_lab.json").write_text(json.dumps(run))
    assert scores.record(tmp_path / "out") == ["06_pipeline_lab"]
    readme = (tmp_path / "README.md").read_text()
    assert "| 06_pipeline_lab | 47 | 1 | 45 | 1 | 0 | 97.8% |" in readme and readme.endswith(f"{scores.END}\nb\n")
    assert any("#3 (constant, unnamed)" in line for line in scores.details_lines())
    (tmp_path / "out" / "06_pipeline_lab.json").write_text(json.dumps(dict(run, tried=10)))
    with pytest.raises(ValueError, match="10 of 47 mutants tried"):
        scores.record(tmp_path / "out")
