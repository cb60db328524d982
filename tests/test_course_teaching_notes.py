"""Issue 40: every notebook carries its teacher's notes (metadata.course.teaching: demo and its minutes, what learners
do alone, questions with answers, problems with fixes, the GPU seat, a lab's mistakes in words, a lesson's day
check) and every lesson its instructor key (labs/solutions/keys/), one answer per exercise the course counts."""

import json

import pytest

from utils.course import minutes, teaching_guide, teaching_notes


def test_every_notebook_has_complete_notes_and_its_key():
    found = [m for p in minutes.notebooks() for m in teaching_notes.problems(
        p, None if teaching_notes.is_lesson(p) else teaching_guide.lab_mistakes(p.stem))]
    assert found == []  # a notebook without notes is a problem too: "has no metadata.course.teaching"


def test_no_key_for_a_lesson_that_is_gone():
    lessons = {p.stem for p in minutes.notebooks() if teaching_notes.is_lesson(p)}
    assert sorted(k.stem for k in teaching_notes.KEYS.glob("*.md") if k.stem not in lessons) == []


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """A copy of lesson 01b (notes and key) in tmp_path, to break one thing at a time."""
    src = minutes.ROOT / "notebooks" / "01b_ring_all_reduce.ipynb"
    (tmp_path / "notebooks").mkdir()
    path = tmp_path / "notebooks" / src.name
    nb = json.loads(src.read_text())
    original = teaching_notes.key_path(src).read_text()
    monkeypatch.setattr(teaching_notes, "KEYS", tmp_path / "keys")
    (tmp_path / "keys").mkdir()
    key = tmp_path / "keys" / f"{src.stem}.md"
    key.write_text(original)

    def write(change=None, key_text=None):
        copy = json.loads(json.dumps(nb))
        if change:
            change(copy["metadata"]["course"])
        path.write_text(json.dumps(copy))
        if key_text is not None:
            key.write_text(key_text)
        return teaching_notes.problems(path)
    return write


def test_the_untouched_copy_passes(planted):
    assert planted() == []


@pytest.mark.parametrize("break_it, said", [
    (lambda c: c["teaching"]["questions"][0].update(a=""), "each a question"),
    (lambda c: c["teaching"].update(questions=c["teaching"]["questions"][:1]), "2 to 4 questions"),
    (lambda c: c["teaching"].update(demo_minutes=c["minutes"]), "demo_minutes"),
    (lambda c: c["teaching"].update(problems=[]), "1 to 3 problems"),
    (lambda c: c["teaching"].update(check="no question mark"), "day-check"),
    (lambda c: c["teaching"].pop("gpu"), "'gpu'"),
    (lambda c: c.pop("teaching"), "no metadata.course.teaching"),
])
def test_each_missing_piece_is_named(planted, break_it, said):
    assert any(said in m for m in planted(break_it)), said


def test_a_key_that_skips_or_adds_an_exercise_is_named(planted):
    text = teaching_notes.KEYS.joinpath("01b_ring_all_reduce.md").read_text()
    dropped = text.replace("## Exercise 1\n", "## Exercise one\n", 1)
    assert any("exercise headings" in m for m in planted(key_text=dropped))
    extra = text.replace("## Check", "## Exercise 99\n\nAn answer to an exercise the lesson does not have.\n\n## Check")
    assert any("exercise headings" in m for m in planted(key_text=extra))
    assert any("no '## Check'" in m for m in planted(key_text=text.replace("## Check", "## Checks")))


def test_a_missing_key_is_named(planted):
    teaching_notes.KEYS.joinpath("01b_ring_all_reduce.md").unlink()
    assert any("no instructor key" in m for m in planted())


def test_a_lab_mistake_the_checker_does_not_name_is_caught(tmp_path):
    lab = minutes.ROOT / "labs" / "01a_halving_reduce_scatter_lab.ipynb"
    known = teaching_guide.lab_mistakes(lab.stem)
    nb = json.loads(lab.read_text())
    nb["metadata"]["course"]["teaching"] = {
        "demo": "the goal and the stub's verdict", "demo_minutes": 10, "alone": "the whole lab, on their own",
        "gpu": "every check runs on CPU ranks over gloo on a seat of one GPU",
        "questions": [{"q": "Why halve the range?", "a": "Each step sends half of what is left."}] * 2,
        "problems": [{"symptom": "a rank times out", "fix": "set WORLD_SIZE = 2"}],
        "mistakes": [{"code": code, "words": f"the mistake the checker calls {code}, in words"} for code in known[:3]]}
    (tmp_path / "labs").mkdir()
    planted = tmp_path / "labs" / lab.name
    planted.write_text(json.dumps(nb))
    assert teaching_notes.problems(planted, known) == []
    assert any("codes unknown" in m for m in teaching_notes.problems(planted, known[1:]))


def test_quizzes_are_found_in_both_forms():
    found = {p.stem: teaching_notes.quizzes(p) for p in minutes.notebooks() if teaching_notes.is_lesson(p)}
    assert any("64 ranks all-reduce a 1 GB gradient" in q for q in found["01b_ring_all_reduce"])  # **Quick quiz.**
    assert len(found["03_zero_from_scratch"]) >= 2 and "which stage first fits" in found["03_zero_from_scratch"][0]
    assert all("<" not in q and q for qs in found.values() for q in qs), "a quiz kept its HTML or came out empty"
    assert sum(map(len, found.values())) >= 20
