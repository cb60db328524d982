"""utils/course/stray_output.py: an executed notebook's warnings and stderr must each be listed and explained."""

import json

import nbformat
import pytest
from utils.course.notebook_runner import ROOT, course_notebooks, execute
from utils.course.stray_output import COURSE_WIDE, explanation_problems, messages, stray_output

RANK_WARNING = ("[rank 1] [rank1]:W1128 16:15:43.504000 18195 torch/distributed/tensor/_redistribute.py:390] "
                "While redistributing from (Shard(dim=0),) ...")


def planted(folder, outputs, expected=()):
    """A notebook with one explanation cell and one code cell carrying ``outputs``; its path."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("Why it warns.", id="why"),
                nbformat.v4.new_code_cell("pass", id="code", outputs=outputs)]
    nb.metadata["course"] = {"expected_output": [{"pattern": p, "cell": "why", "says": "warns"} for p in expected]}
    path = folder / "planted.ipynb"
    nbformat.write(nb, path)
    return path


def stream(name, text):
    return nbformat.v4.new_output("stream", name=name, text=text)


def test_an_unlisted_warning_is_stray_and_a_listed_one_is_not(tmp_path):
    outputs = [stream("stdout", "loss 0.5\n"),
               stream("stderr", "/tmp/x.py:3: UserWarning: planted\n  warnings.warn('planted')\n"),
               stream("stderr", RANK_WARNING + "\n"),
               stream("stdout", "[rank0]: FutureWarning: from a torchrun script\n")]
    stray = stray_output(planted(tmp_path, outputs))
    assert stray == ["cell code: /tmp/x.py:3: UserWarning: planted\n  warnings.warn('planted')",  # one message
                     f"cell code: {RANK_WARNING}", "cell code: [rank0]: FutureWarning: from a torchrun script"]
    listed = planted(tmp_path, outputs, ["UserWarning: planted", "While redistributing", "from a torchrun"])
    assert stray_output(listed) == []
    assert len(stray_output(planted(tmp_path, outputs, ["UserWarning: planted"]))) == 2  # the others still count


def test_plain_stdout_is_not_a_warning_but_any_stderr_is():
    assert messages([stream("stdout", "a warning-free line: 3 ranks\n")]) == []
    source = 'warnings.filterwarnings("ignore", category=UserWarning)\nlog.setLevel(logging.WARNING)\n'
    assert messages([stream("stdout", source)]) == []  # a lesson printing source code that names them
    assert messages([stream("stdout", "[2026-11-28 16:19:06,297] [WARNING] [engine.py:2304] untested\n")]) != []
    assert messages([stream("stderr", "[rank 0] anything at all\n[rank 0]   its indented next line\n")]) == [
        "[rank 0] anything at all", "[rank 0]   its indented next line"]  # joined only below a warning


def test_torchs_glog_lines_with_no_thread_id_are_warnings():
    socket_line = "[rank0]:[W1128 16:40:23.042158657 socket.cpp:767] [c10d] The client socket has failed to connect"
    assert messages([stream("stdout", socket_line + "\n")]) == [socket_line]
    assert messages([stream("stdout", "[E1128 16:40:23.042158657 ProcessGroupGloo.cpp:143] x\n")]) != []
    assert messages([stream("stdout", "F1128 16:40:23.042158 12 torch/x.cpp:1] fatal\n")]) != []
    assert messages([stream("stdout", "W1128 is a word, 16:40 a time\n")]) == []


def test_a_displayed_or_returned_value_is_scanned_too(tmp_path):
    value = "'step 3\\n[rank1]:[W1128 16:40:23.042158657 socket.cpp:767] planted'"
    outputs = [nbformat.v4.new_output("execute_result", data={"text/plain": value}, execution_count=1),
               nbformat.v4.new_output("display_data", data={"text/plain": "x.py:1: UserWarning: shown\nfine"}),
               nbformat.v4.new_output("display_data", data={"image/png": "iVBORw0KGgo="})]
    assert messages(outputs) == [value, "x.py:1: UserWarning: shown"]
    assert stray_output(planted(tmp_path, outputs, ["planted", "UserWarning: shown"])) == []


def test_an_indented_line_joins_only_a_warning_or_traceback_and_is_still_checked(tmp_path):
    hidden = "[rank 0]   /x.py:9: UserWarning: hidden planted"
    outputs = [stream("stderr", f"[rank 0] /a.py:1: UserWarning: listed\n[rank 0]   warnings.warn('listed')\n{hidden}\n"
                                "[rank 0] a listed plain line\n[rank 0]   an indented stray line\n"
                                "Traceback (most recent call last):\n  File \"t.py\", line 1, in <module>\n"
                                "ValueError: listed too\n")]
    assert messages(outputs) == ["[rank 0] /a.py:1: UserWarning: listed\n[rank 0]   warnings.warn('listed')", hidden,
                                 "[rank 0] a listed plain line", "[rank 0]   an indented stray line",
                                 'Traceback (most recent call last):\n  File "t.py", line 1, in <module>',
                                 "ValueError: listed too"]
    listed = ["UserWarning: listed", "a listed plain line", "^Traceback", "ValueError: listed too"]
    assert stray_output(planted(tmp_path, outputs, listed)) == [f"cell code: {hidden}",
                                                                 "cell code: [rank 0]   an indented stray line"]


def test_a_real_warning_of_an_executed_notebook_is_caught(tmp_path):
    """papermill runs a notebook that warns and writes to stderr: the check sees both, as the suite would."""
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "language": "python",
                                                           "display_name": "Python 3"}})
    nb.cells = [nbformat.v4.new_code_cell("import sys, warnings\nwarnings.warn('planted, unlisted')\n"
                                          "print('to stderr', file=sys.stderr)", id="warns")]
    path = tmp_path / "warns.ipynb"
    nbformat.write(nb, path)
    ok, _, log = execute(path, tmp_path / "out", timeout=120)
    assert ok, log[-2000:]
    stray = stray_output(tmp_path / "out" / tmp_path.name / "warns.ipynb", path)
    assert any("UserWarning: planted, unlisted" in s for s in stray) and any("to stderr" in s for s in stray), stray


@pytest.mark.parametrize("path", course_notebooks(), ids=lambda p: p.name)
def test_every_listed_message_names_a_cell_of_its_notebook(path):
    assert explanation_problems(path) == []


def test_the_course_wide_messages_are_explained_where_they_say():
    for entry in COURSE_WIDE:
        cells = {c["id"]: "".join(c["source"]) for c in json.loads((ROOT / entry["notebook"]).read_text())["cells"]}
        assert entry["cell"] in cells, entry
        assert entry["says"] in cells[entry["cell"]], entry


def test_a_bad_entry_is_named(tmp_path):
    path = planted(tmp_path, [], ["("])
    nb = json.loads(path.read_text())
    nb["metadata"]["course"]["expected_output"] += [{"pattern": "x", "cell": "gone", "says": "warns"},
                                                    {"pattern": "x", "cell": "why"},
                                                    {"pattern": "x", "cell": "why", "says": "not in that cell"}]
    path.write_text(json.dumps(nb))
    problems = explanation_problems(path)
    assert len(problems) == 4 and "not a regular expression" in problems[0] and "'gone'" in problems[1], problems
    assert "'says'" in problems[2] and "does not say 'not in that cell'" in problems[3], problems


def test_an_entry_naming_another_cell_of_a_lesson_fails(tmp_path):
    """A real lesson's entry pointed at the wrong cell (one that exists) is caught by its quote."""
    nb = json.loads((ROOT / "notebooks" / "11b_hangs_and_profiles.ipynb").read_text())
    entry = nb["metadata"]["course"]["expected_output"][0]
    entry["cell"] = next(c["id"] for c in nb["cells"] if c["id"] != entry["cell"])
    path = tmp_path / "11b.ipynb"
    path.write_text(json.dumps(nb))
    problems = explanation_problems(path)
    assert len(problems) == 1 and f"cell {entry['cell']!r}" in problems[0], problems


def test_every_notebook_run_of_the_suite_and_make_course_is_checked():
    """Both notebook tests call the check, and `make course` runs it on the folder notebook_runner writes."""
    import inspect
    import subprocess

    from tests import test_notebooks
    from utils.course.notebook_runner import BUILD

    for test in (test_notebooks.test_notebook_runs, test_notebooks.test_notebook_on_one_gpu):
        assert "assert_no_stray_output(" in inspect.getsource(test), test.__name__
    recipe = subprocess.run(["make", "-n", "--no-print-directory", "course"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout
    assert f"-m utils.course.stray_output {(BUILD / 'course').relative_to(ROOT)}" in recipe, recipe
