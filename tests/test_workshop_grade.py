"""The workshop's grader (utils/workshop/grade.py): bad submissions are verdicts, never a stopped or hung grader.

The submissions are the labs' own notebooks with their answer cells edited (utils/workshop/submissions.py): the
stub, the reference solution, and answers that break the grader's rules on purpose. Lab 06's check is the
cheapest (its learner function runs in the grading process; only torch's schedule runs on 2 ranks), so the
bad answers are lab 06 answers; lab 03's make_buckets part shows a multi-part lab in the flat layout.
"""

import json
import os
import sys
import time
from pathlib import Path

import nbformat
import pytest

from utils.workshop.submissions import notebook_with, reference_notebook, reference_source
from utils.workshop import grade as grader
from utils.workshop.sandbox import available
from utils.workshop.gradebook import cell, write_gradebook

ROOT = Path(__file__).resolve().parents[1]
LAB = "06_pipeline_lab"
NAME = "interleaved_one_f_one_b"
SIGNATURE = f"def {NAME}(rank, ranks, microbatches, chunks):\n"
MEGABYTES = 20  # what the chatty answer prints
SANDBOX = available() is None  # bubblewrap works here: the hostile answers below run in it (issue 37)
DAEMON = "4321.5"  # the seconds a planted daemon sleeps: how the test finds it afterwards

BAD = {  # learner -> (the answer cell's new source, or a notebook's raw text), the gradebook cell expected
    "reference": (None, "pass"),
    "stub": ("stub", "not written yet"),
    "not_json": ('{"cells": [ this is not JSON', "does not parse"),
    "syntax_error": ("def broken(:\n    pass\n", "does not parse"),
    "missing": ("# I deleted the function\nx = 1\n", f"missing {NAME}"),
    "never_returns": (SIGNATURE + "    while True:\n        pass\n", "timeout"),
    "exits": ("import os\n\n" + SIGNATURE + "    os._exit(3)\n", "crash"),
    "kills_itself": ("import os, signal\n\n" + SIGNATURE + "    os.kill(os.getpid(), signal.SIGKILL)\n", "crash"),
    "writes_outside": ("import os\n\n" + SIGNATURE + "    for path in ('~/planted-by-grade-test',"
                       " '../planted-by-grade-test', 'planted-by-grade-test'):\n"
                       "        open(os.path.expanduser(path), 'w').write('x')\n    return []\n", "no_divisibility_check"),
    # the judge reads the import without running it, and names it
    "imports_reference": (f"from labs.solutions.pipeline_schedule import {NAME}\n", "imports_reference"),
    "prints_megabytes": (SIGNATURE + f"    print('x' * {MEGABYTES << 20}, flush=True)\n    return []\n",
                         "no_divisibility_check"),
}


if SANDBOX:  # answers that only the sandbox stops: without it they would read the solutions, outlive the grader,
    # take the machine's memory, or write into every other learner's folder
    BAD.update({
        "reads_solutions_by_path": (SIGNATURE + "    found = {}\n    exec(open("
                                    f"{str(ROOT / 'labs' / 'solutions' / 'pipeline_schedule.py')!r}).read(), found)\n"
                                    f"    return found[{NAME!r}](rank, ranks, microbatches, chunks)\n", "raised"),
        "leaves_a_daemon": ("import subprocess\n\n" + SIGNATURE + "    subprocess.Popen(['sleep', '" + DAEMON + "'], "
                            "start_new_session=True)\n    return []\n", "no_divisibility_check"),
        "takes_20_gib": ("import torch\n\n" + SIGNATURE + "    torch.empty(20 << 30, dtype=torch.uint8).fill_(1)\n"
                         "    return []\n", "over the memory limit"),
        "writes_everywhere": ("import glob, os\n\n" + SIGNATURE + "    for path in glob.glob('/tmp/**/*.ipynb', recursive="
                              "True) + glob.glob(os.path.expanduser('~/**/*.ipynb'), recursive=True)[:50]:\n"
                              "        try:\n            open(path, 'w').write('{}')\n        except OSError:\n"
                              "            pass\n    return []\n", "no_divisibility_check"),
    })


# Left out of the repository's listing: what is not the course (.venv, .git, caches), and what the notebooks that
# run beside this test under pytest-xdist write (build/, data/): the answers' writes are aimed elsewhere.
NOT_COMPARED = (".venv", ".git", "__pycache__", ".pytest_cache", ".ipynb_checkpoints", "build", "data")
CLASSROOM = ".grade-test-"  # a class's folder inside the course (nbgrader's default), made and removed by a test


def _listing(folder, skip=NOT_COMPARED):
    """Every file under ``folder`` with its size and mtime (the folders in ``skip`` left out)."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if d not in skip and not d.startswith(CLASSROOM)]
        for name in filenames:
            path = Path(dirpath, name)
            try:
                stat = path.lstat()
            except FileNotFoundError:
                continue
            found[str(path.relative_to(folder))] = (stat.st_size, stat.st_mtime_ns)
    return found


def _submit(folder, learner, source):
    path = folder / "submitted" / learner / "lab06" / f"{LAB}.ipynb"
    path.parent.mkdir(parents=True)
    if source is not None and source.startswith('{"cells"'):
        path.write_text(source)
    elif source == "stub":
        nbformat.write(notebook_with(LAB), str(path))
    elif source is None:
        nbformat.write(reference_notebook(LAB), str(path))
    else:
        nbformat.write(notebook_with(LAB, {NAME: source}), str(path))


def test_output_is_kept_head_and_tail():
    """An answer's output as a judge keeps it (``utils.launch.children.Output`` with a ``limit``, here 100 bytes,
    reading the answer's own pipe)."""
    import subprocess

    from utils.launch.children import Output

    prints = "import sys; sys.stdout.write('a' * 60 + 'b' * 10_000 + 'c' * 60)"
    output = Output(100)
    child = subprocess.Popen([sys.executable, "-c", prints], stdout=subprocess.PIPE)
    output.read(child.stdout)
    child.wait()
    text = output.text()
    assert text.startswith("a" * 50) and text.endswith("c" * 50) and "10,020 bytes of output left out" in text
    assert len(text) < 200


def test_cell_names_what_went_wrong_part_by_part():
    v = lambda verdict, mistake="", part="p": grader.Verdict("l", "lab", part, verdict, mistake)  # noqa: E731
    assert cell([v("pass"), v("pass")]) == "pass"
    assert cell([v("mistake", "bucket_order")]) == "bucket_order"
    assert cell([v("unparsable", part="a"), v("unparsable", part="b")]) == "does not parse"
    assert cell([v("pass", part="a"), v("not written", part="b")]) == "b: not written yet"


def test_finds_both_layouts_and_skips_other_notebooks(tmp_path):
    for path in ("submitted/ann/lab06/06_pipeline_lab.ipynb", "submitted/ann/03_zero_lab.ipynb",
                 "submitted/ann/lab06/scratch.ipynb", "submitted/ann/.ipynb_checkpoints/03_zero_lab-checkpoint.ipynb"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("{}")
    answers, skipped, learners = grader.find_submissions(tmp_path)  # the course folder: its submitted/ is used
    assert [(a.learner, a.lab, a.feedback) for a in answers] == [
        ("ann", "03_zero_lab", "03_zero_lab.md"), ("ann", "06_pipeline_lab", "lab06/06_pipeline_lab.md")]
    assert skipped == {"ann/lab06/scratch.ipynb": "not a lab of the course"} and learners == {"ann": ""}
    plenty = 64 * 2**30
    assert grader.default_workers(4, cores=2, memory=plenty) == 2 and grader.default_workers(4, 16, plenty) == 16
    assert grader.default_workers(4, 16, memory=8 * 2**30) == 4 and grader.default_workers(4, 16, memory=0) == 1


def test_every_learner_folder_is_a_row(tmp_path):
    """Issue 37: an empty folder, or one named ``..x``, got no row. Every folder under submitted/ but .ipynb_checkpoints
    is a learner now, whatever its name; a symlinked one has a row that says it was not followed (find_submissions says why), and a
    notebook linked out of submitted/ is not read."""
    submitted, outside = tmp_path / "course" / "submitted", tmp_path / "elsewhere"
    lab = f"{LAB}.ipynb"
    with_lab = ["..x", "a learner", "Zoë 李", "ann"]  # each hands in lab 06
    for name in with_lab:
        (submitted / name / "lab06").mkdir(parents=True)
        (submitted / name / "lab06" / lab).write_text("{}")
    (submitted / "empty").mkdir()
    (submitted / ".hidden").mkdir()
    (submitted / ".hidden" / "notes.ipynb").write_text("{}")  # a notebook, but no lab
    (submitted / ".ipynb_checkpoints").mkdir()  # Jupyter's, no learner
    (submitted / "README.txt").write_text("a file, no learner")
    (outside / "bob").mkdir(parents=True)
    (outside / "bob" / lab).write_text("{}")
    (outside / "03_zero_lab.ipynb").write_text("{}")
    (submitted / "linked").symlink_to(outside / "bob", target_is_directory=True)
    try:  # a name that is not UTF-8 (Linux allows any bytes; macOS refuses them)
        os.mkdir(os.fsencode(submitted) + b"/caf\xe9")
        with_lab.append(os.fsdecode(b"caf\xe9"))
        (submitted / with_lab[-1] / lab).write_text("{}")
        (submitted / with_lab[-1] / "notes.ipynb").write_text("{}")  # skipped, so the command line prints its name
    except OSError:
        pass
    (submitted / "ann" / "03_zero_lab.ipynb").symlink_to(outside / "03_zero_lab.ipynb")

    answers, skipped, learners = grader.find_submissions(submitted.parent)
    assert sorted(learners) == sorted(with_lab + ["empty", ".hidden", "linked"])
    assert learners["linked"] == grader.LINK and all(learners[n] == "" for n in learners if n != "linked")
    assert sorted(a.learner for a in answers) == sorted(with_lab) and {a.lab for a in answers} == {LAB}
    assert all(a.notebook.is_relative_to(submitted.resolve()) for a in answers), "an answer read from outside"
    assert skipped[".hidden/notes.ipynb"] == "not a lab of the course"
    assert "not followed" in skipped["ann/03_zero_lab.ipynb"] and "copy it in" in skipped["linked"]

    verdicts = [grader.Verdict(a.learner, a.lab, "only part", "pass") for a in answers]
    csv_path, html_path = write_gradebook(answers, verdicts, tmp_path / "out", learners, [LAB])
    import csv
    with open(csv_path, newline="", encoding="utf-8") as f:
        rows = {row[0]: row[1:] for row in csv.reader(f)}
    shown = lambda name: name.encode("utf-8", "backslashreplace").decode()  # noqa: E731 -- non-UTF-8 bytes as \udcXX
    assert rows.pop("learner") == [LAB, "labs passed"]
    assert sorted(rows) == sorted(map(shown, learners)), "a learner without a row, or a row without a learner"
    assert all(rows[shown(name)] == ["pass", "1/1"] for name in with_lab)
    assert rows["empty"] == rows[".hidden"] == ["not submitted", "0/1"]
    assert rows["linked"] == [grader.LINK, "0/1"]
    import re
    from urllib.parse import unquote_to_bytes
    links = re.findall(r'<a href="([^"]+)">', html_path.read_text(encoding="utf-8"))
    assert len(links) == len(with_lab), links
    assert all(os.path.isfile(os.fsencode(html_path.parent) + b"/" + unquote_to_bytes(href)) for href in links), links
    assert "a%20learner/lab06/" in html_path.read_text(encoding="utf-8"), "a space in a link, not encoded"

    # The command line prints every name, on a terminal that refuses what is not UTF-8 too (no lab graded here).
    import subprocess
    command = [sys.executable, "-m", "utils.workshop.grade", str(submitted), str(tmp_path / "cli"), "--labs", "03_zero_lab",
               *([] if SANDBOX else ["--no-sandbox"])]  # without bubblewrap the grader refuses unless told
    done = subprocess.run(command, cwd=ROOT, capture_output=True, env=dict(os.environ, PYTHONIOENCODING="utf-8:strict"))
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    with open(tmp_path / "cli" / "gradebook.csv", newline="", encoding="utf-8") as f:
        assert sorted(row[0] for row in csv.reader(f)) == sorted(["learner", *map(shown, learners)])


def test_a_learner_named_submitted_and_links_inside_submitted(tmp_path, monkeypatch):
    """Review of issue 37: given submitted/ itself, a learner named ``submitted`` made it step in and lose every other
    row; a symlink loop crashed the run (``resolve()`` raises RuntimeError); a notebook linked to another learner's
    was graded as the first learner's; a linked subfolder inside a learner was silently ignored; an unreadable
    learner folder read as not submitted."""
    submitted = tmp_path / "submitted"
    lab = f"{LAB}.ipynb"
    for name in ("ann", "submitted", "bob", "cy", "dee"):
        (submitted / name).mkdir(parents=True)
    (submitted / "ann" / lab).write_text("{}")
    (submitted / "submitted" / lab).write_text("{}")
    (submitted / "loop").symlink_to("loop")  # a learner that is a symlink loop
    (submitted / "bob" / lab).symlink_to(submitted / "ann" / lab)  # bob's notebook is ann's file
    (submitted / "bob" / "03_zero_lab.ipynb").symlink_to("03_zero_lab.ipynb")  # a notebook linked to itself
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / lab).write_text("{}")
    (submitted / "cy" / "lab06").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (submitted / "dee" / lab).write_text("{}")
    real_scandir = os.scandir

    def scandir(path="."):  # as root, chmod 000 still reads: plant the error os.walk meets instead
        if os.fspath(path) == os.fspath(submitted / "dee"):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_scandir(path)
    monkeypatch.setattr(os, "scandir", scandir)

    answers, skipped, learners = grader.find_submissions(submitted)
    assert sorted(learners) == ["ann", "bob", "cy", "dee", "loop", "submitted"], learners
    assert sorted((a.learner, a.lab) for a in answers) == [("ann", LAB), ("submitted", LAB)]
    assert learners["loop"] == grader.LINK and "it points to loop" in skipped["loop"]
    assert skipped[f"bob/{lab}"].startswith(grader.LINK) and str(submitted / "ann" / lab) in skipped[f"bob/{lab}"]
    assert "it points to 03_zero_lab.ipynb" in skipped["bob/03_zero_lab.ipynb"]
    assert skipped["cy/lab06"].startswith(grader.LINK) and learners["cy"] == ""
    assert "Permission denied" in skipped["dee"] and "could not be read" in learners["dee"]
    # The course folder around submitted/ still works, and steps in.
    assert grader.find_submissions(tmp_path).learners == learners


def test_gradebook_columns_are_the_courses_labs(tmp_path):
    """Review of issue 37: the columns came from the labs handed in, so a lab nobody handed in had no column and a
    class that handed in nothing had rows without cells. The columns are the course's labs (or ``--labs``)."""
    import csv
    from utils.checkers.labs import LABS
    answers = [grader.Answer("ann", LAB, tmp_path / f"{LAB}.ipynb", f"{LAB}.md")]
    verdicts = [grader.Verdict("ann", LAB, "only part", "pass")]
    with open(write_gradebook(answers, verdicts, tmp_path / "one", {"ann": "", "bo": ""})[0], newline="") as f:
        rows = {row[0]: row[1:] for row in csv.reader(f)}
    assert rows["learner"] == [*LABS, "labs passed"] and len(LABS) > 1
    assert rows["ann"] == ["pass" if lab == LAB else "not submitted" for lab in LABS] + [f"1/{len(LABS)}"]
    with open(write_gradebook([], [], tmp_path / "none", {"ann": "", "bo": ""}, ["02_ddp_lab", LAB])[0]) as f:
        assert list(csv.reader(f)) == [["learner", "02_ddp_lab", LAB, "labs passed"],
                                       ["ann", "not submitted", "not submitted", "0/2"],
                                       ["bo", "not submitted", "not submitted", "0/2"]]


@pytest.mark.slow
def test_bad_submissions_are_verdicts_and_touch_nothing_outside(tmp_path):
    for learner, (source, _) in BAD.items():
        _submit(tmp_path, learner, source)
    flat = tmp_path / "submitted" / "zed" / "03_zero_lab.ipynb"  # the flat layout, a lab of two parts
    flat.parent.mkdir()
    nbformat.write(notebook_with("03_zero_lab", {"make_buckets": reference_source("03_zero_lab")}), str(flat))
    answers, _, learners = grader.find_submissions(tmp_path / "submitted")
    home_file = Path.home() / "planted-by-grade-test"
    assert not home_file.exists()
    before = _listing(ROOT)

    # Two timeouts, so that a loaded machine cannot turn a right answer into a wrong verdict: the answers that end are
    # graded with a timeout far above their time (a right lab-06 answer takes ~5 s alone on 2 cores, once past 60 s
    # with the suite and five other jobs on the machine), the one that never returns with a short one (it runs
    # exactly that long whatever the load).
    timeout, hang_timeout = 240, 20
    lab = [a for a in answers if a.lab == LAB]
    zero = [a for a in answers if a.lab == "03_zero_lab"]
    start = time.perf_counter()
    ending = grader.grade([a for a in lab if a.learner != "never_returns"], world_size=2, workers=2, timeout=timeout)
    ended = time.perf_counter() - start
    hung = grader.grade([a for a in lab if a.learner == "never_returns"], world_size=2, workers=1, timeout=hang_timeout)
    verdicts = ending + hung
    verdicts.append(grader.run_answer(zero[0], 0, world_size=2, timeout=timeout))  # make_buckets only
    seconds = time.perf_counter() - start
    paths = write_gradebook(answers, verdicts, tmp_path / "out", learners, ["03_zero_lab", LAB])

    assert _listing(ROOT) == before, "an answer changed a file of the repository"
    others = {p: p.read_text() for p in (tmp_path / "submitted").rglob("*.ipynb")}
    assert all(text.strip() != "{}" for text in others.values()), "an answer wrote into another learner's notebook"
    if SANDBOX:
        import subprocess
        left = subprocess.run(["pgrep", "-f", f"sleep {DAEMON}"], capture_output=True, text=True).stdout.split()
        assert not left, f"a daemon outlived its answer: pids {left}"
    assert not home_file.exists(), "an answer wrote to the grader's HOME"
    import tempfile
    assert not list(Path(tempfile.gettempdir()).glob("grade-*/**/planted-by-grade-test")), "a run's folder was kept"
    by_learner = {v.learner: v for v in verdicts if v.lab == LAB}
    got = {learner: cell([by_learner[learner]]) for learner in BAD}
    assert got == {learner: want for learner, (_, want) in BAD.items()}
    assert verdicts[-1].verdict == "pass", verdicts[-1]
    # What "stopped, not waited for" means, in numbers that hold on a loaded 2-core machine: an answer is killed at
    # its timeout, its judge's whole tree at once, then run_answer waits at most 10 s for the output pipe's end;
    # STOP_MARGIN adds 5 s for a busy machine to wake the grader's thread. And the grader waits for nothing but its
    # answers: on 2 workers dealing the answers out as they free up (a list schedule), the wall time is at most
    # sum/2 + max/2 of the answers' own times (Graham's bound), each with PER_ANSWER s of the grader's own work (a
    # folder made and removed, a verdict read). One answer at a time, or a wait past a timeout, breaks the bound.
    STOP_MARGIN, PER_ANSWER = 10 + 5, 3
    never = by_learner["never_returns"].seconds
    assert hang_timeout <= never < hang_timeout + STOP_MARGIN, f"the answer that never returns stopped after {never} s"
    slowest = max(verdicts, key=lambda v: v.seconds)
    assert slowest.seconds < timeout + STOP_MARGIN, f"{slowest.learner}'s answer held the grader {slowest.seconds} s"
    each = [v.seconds + PER_ANSWER for v in ending]  # lab 06's answers that end, on 2 workers
    bound = sum(each) / 2 + max(each) / 2
    assert ended < bound, f"grading took {ended:.0f} s, more than its answers' {bound:.0f} s on 2 workers"
    assert seconds < ended + max(v.seconds for v in hung) + verdicts[-1].seconds + 2 * PER_ANSWER, \
        "the grader waited past its answers"

    results = paths[0].parent / "results.json"
    assert results.stat().st_size < 200_000, "an answer's output went into the gradebook whole"
    chatty = by_learner["prints_megabytes"].output
    assert "bytes of output left out" in chatty and len(chatty) <= grader.OUTPUT_LIMIT + 100
    rows = {row.split(",")[0]: row.split(",") for row in paths[0].read_text().splitlines()}
    assert rows["learner"] == ["learner", "03_zero_lab", LAB, "labs passed"]
    assert rows["zed"] == ["zed", "pass", "not submitted", "1/2"]  # its make_buckets part, the one graded here
    feedback = (tmp_path / "out" / "feedback" / "stub" / "lab06" / f"{LAB}.md").read_text()
    assert "not written yet" in feedback and "## YOUR CODE" in feedback
    assert "no_divisibility_check" in paths[1].read_text()
    print(json.dumps({learner: [v.label, v.seconds] for learner, v in by_learner.items()}, indent=1))
    print(f"grading the answers that end took {ended:.1f} s; the bound from their times: {bound:.1f} s")
    ref = by_learner["reference"]  # issue 37: the overhead of isolating an answer, reported
    assert 0 < ref.starting < ref.checking <= ref.seconds, ref
    print(grader.overhead_line(verdicts))


def test_without_the_sandbox_the_grader_refuses_unless_told(tmp_path, monkeypatch):
    from utils.workshop import sandbox

    monkeypatch.setattr(sandbox, "available", lambda: "no `bwrap` on PATH: install bubblewrap")
    (tmp_path / "submitted").mkdir()
    with pytest.raises(SystemExit):
        grader.main([str(tmp_path / "submitted"), str(tmp_path / "out")])
    grader.main([str(tmp_path / "submitted"), str(tmp_path / "out"), "--no-sandbox"])
    assert (tmp_path / "out" / "gradebook.csv").exists()


@pytest.mark.skipif(not SANDBOX, reason="the CPU-time limit is the sandbox's (prlimit)")
def test_an_answer_over_its_cpu_time_is_named_time(tmp_path, monkeypatch):
    """CPU_LIMIT seconds of CPU per process: a loop that spins past them is ``time``, whatever the wall clock (the
    timeout is far above, so that a loaded machine still reaches the CPU limit first)."""
    monkeypatch.setattr(grader, "CPU_LIMIT", 6)
    _submit(tmp_path, "spinner", SIGNATURE + "    while True:\n        pass\n")  # spins in the grading process
    ranks = tmp_path / "submitted" / "rank_spinner" / "01a_halving_reduce_scatter_lab.ipynb"  # spins in its ranks
    ranks.parent.mkdir(parents=True)
    nbformat.write(notebook_with("01a_halving_reduce_scatter_lab", {"halving_reduce_scatter": (
        "def halving_reduce_scatter(tensor):\n    while True:\n        pass\n")}), str(ranks))
    answers, _, _ = grader.find_submissions(tmp_path / "submitted")
    for answer in answers:
        verdict = grader.run_answer(answer, 0, world_size=2, timeout=300)
        assert (verdict.verdict, cell([verdict])) == ("time", "over the CPU-time limit"), verdict
        assert "6 s of CPU" in verdict.hint


@pytest.mark.skipif(not SANDBOX, reason="without the sandbox an answer can read what the grader can")
def test_an_answer_cannot_read_a_classmates_notebook(tmp_path):
    """The class's folders where nbgrader puts them by default, inside the course, which the sandbox reads: the
    grader's command (main) hides the submissions and the gradebook; the same answer run without them hidden reads
    its classmate's notebook, so the test would fail if main stopped hiding them."""
    import shutil
    import tempfile

    course = Path(tempfile.mkdtemp(dir=ROOT, prefix=CLASSROOM))
    try:
        victim = course / "submitted" / "victim" / "lab06" / f"{LAB}.ipynb"
        _submit(course, "victim", None)
        _submit(course, "thief", SIGNATURE + f"    open({str(victim)!r}).read()\n    return []\n")
        grader.main([str(course / "submitted"), str(course / "out"), "--labs", LAB, "--world-size", "2",
                     "--timeout", "240", "--workers", "2"])
        rows = {row.split(",")[0]: row.split(",")[1] for row in
                (course / "out" / "gradebook.csv").read_text().splitlines()}
        assert rows["victim"] == "pass" and rows["thief"] == "raised", rows
        thief = [a for a in grader.find_submissions(course / "submitted")[0] if a.learner == "thief"][0]
        seen = grader.run_answer(thief, 0, world_size=2, timeout=240)  # the submissions not hidden
        assert seen.verdict == "mistake", seen  # it read the notebook, and returned []
    finally:
        shutil.rmtree(course)
