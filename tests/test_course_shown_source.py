"""utils/course/shown_source.py: the utils functions and classes the lessons print as source, listed in
utils/course/shown_source.json, so that an edit to one names the lessons whose text it edits. Nothing is executed."""

import json

import pytest
from utils.course.changes import ROOT
from utils.course.shown_source import (LIST, WRITE, _working_tree, changed_shown, current, edited, locate,
                                       notebook_shows, read_list, stale)

HINT = f"run `.venv/bin/{WRITE}` and commit utils/course/shown_source.json (its git diff says which lessons changed)"


def test_every_show_is_read_statically():
    """Each ``inspect.getsource(x)`` of a notebook resolves, through the cell's imports, to a utils object."""
    problems = current()[1]
    assert not problems, "\n".join(problems) + f"\nor list the cell's objects under by_hand in {LIST.name}"


def test_the_list_is_current():
    listed, by_hand = read_list()
    differences = stale(listed, current(by_hand=by_hand)[0])
    assert not differences, "utils/course/shown_source.json is stale:\n" + "\n".join(differences) + "\n" + HINT


def test_the_list_is_large_and_canonical():
    """A sanity floor (82 objects in 23 notebooks when it was written), and every key the defining module's."""
    listed = read_list()[0]
    assert len(listed) > 50 and len({nb for nbs in listed.values() for nb in nbs}) > 15
    assert "utils.pipeline.schedules.one_f_one_b_order" in listed  # lesson 06a imports it from utils.pipeline
    assert "utils.tensor_parallel.compare.compare" in listed  # the function the package rebinds, not the module
    assert [key for key in listed if (locate(key) or (None,))[0] != key] == []


# --- planted wrong states -------------------------------------------------------------------------------------

def _notebook(tmp_path, *cells):
    cells = [{"cell_type": "code", "id": f"c{i}", "metadata": {}, "outputs": [], "execution_count": None,
              "source": source} for i, source in enumerate(cells)]
    path = tmp_path / "99_planted.ipynb"
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


IMPORTS = ("import inspect\nfrom IPython.display import Code\nfrom torch.nn import Linear\n"
           "from utils.models import make_model\nfrom utils.datasets import batch\n"
           "from utils import pipeline\nimport utils\n\n"
           "def mine():\n    pass")


def test_shows_are_resolved_through_imports_and_reexports(tmp_path):
    path = _notebook(tmp_path, IMPORTS,
                     "print(inspect.getsource(make_model))",
                     'Code(inspect.getsource(pipeline.one_f_one_b_order), language="python")',  # a re-export
                     "inspect.getsource(Linear); inspect.getsource(mine)",  # torch's and the notebook's own: not ours
                     "%%ranks 2\nprint(inspect.getsource(utils.sharding.recompute._one))",
                     "batch??",
                     "%%time\nx = inspect.getsource(batch)",  # a cell magic over Python
                     "%%bash\necho 'inspect.getsource(nothing)'",  # over something else: not read
                     "show = make_model\nprint(inspect.getsource(show))")  # an alias of an import
    shows, unresolved = notebook_shows(path)
    assert unresolved == []
    assert sorted(key for key, _ in shows) == [
        "utils.datasets.batch", "utils.datasets.batch", "utils.models.make_model", "utils.models.make_model",
        "utils.pipeline.schedules.one_f_one_b_order", "utils.sharding.recompute._one"]


def test_a_show_that_cannot_be_resolved_names_its_notebook_and_cell(tmp_path):
    path = _notebook(tmp_path, IMPORTS, "for f in (make_model, batch):\n    print(inspect.getsource(f))",
                     "print(inspect.getsource(pipeline.no_such_function))")
    found, problems = current(notebooks=[path], by_hand={})
    assert len(problems) == 2 and all(str(path) in p for p in problems), problems
    assert "cell 1 (id c1)" in problems[0] and "`f`" in problems[0]
    assert "cell 2 (id c2)" in problems[1] and "no function, class or module of utils" in problems[1]
    # listed by hand, the loop's cell counts as showing what it says
    found, problems = current(notebooks=[path], by_hand={f"{path}#c1": ["utils.datasets.batch"]})
    assert len(problems) == 1 and found == {"utils.datasets.batch": [str(path)]}


def test_a_notebook_showing_an_unlisted_function_is_stale(tmp_path):
    path = _notebook(tmp_path, IMPORTS, "print(inspect.getsource(batch))")
    found = current(notebooks=[path], by_hand={})[0]
    listed = {"utils.models.make_model": [str(path)]}
    assert stale(listed, found) == [f"{path} shows utils.datasets.batch, which the list does not say",
                                    f"the list says {path} shows utils.models.make_model; it does not"]
    assert stale(found, found) == []


def test_a_listed_function_that_is_gone_is_stale():
    key = "utils.models.make_model"
    source = _working_tree("utils/models.py").replace("def make_model(", "def build_model(")
    without = lambda p: source if p == "utils/models.py" else _working_tree(p)  # noqa: E731
    assert stale({key: ["notebooks/02a_ddp_from_scratch.ipynb"]}, {key: ["notebooks/02a_ddp_from_scratch.ipynb"]},
                 without) == [f"the list names {key}, which is no function, class or module of utils now"]
    # a key that names a re-export, not the definition, is not the canonical one either
    assert stale({"utils.pipeline.one_f_one_b_order": []}, {}) != []


# --- what a change edits ----------------------------------------------------------------------------------------

def test_an_edit_names_the_shown_objects_and_their_lessons():
    shown = {"utils.models.make_model": ["notebooks/02a_ddp_from_scratch.ipynb"],
             "utils.models.train_reference": ["notebooks/02a_ddp_from_scratch.ipynb"],
             "utils.comm.p2p.sendrecv": ["notebooks/01a_point_to_point_and_collectives.ipynb"]}
    path = "utils/models.py"
    before = _working_tree(path)
    body = before.replace("    torch.manual_seed(seed)", "    torch.manual_seed(seed + 0)", 1)  # in make_model
    body = body.replace('"sgd" (lessons 02, 06)', '"sgd" (lessons 02 and 06)', 1)  # make_optimizer: not shown
    assert body.count("manual_seed(seed + 0)") == body.count("lessons 02 and 06") == 1
    after = lambda p: body if p == path else _working_tree(p)  # noqa: E731
    assert edited(shown, _working_tree, after, {path}) == [
        ("utils.models.make_model", ["notebooks/02a_ddp_from_scratch.ipynb"], "edited")]
    gone = lambda p: None if p == path else _working_tree(p)  # noqa: E731
    assert [how for _, _, how in edited(shown, _working_tree, gone, {path})] == ["removed", "removed"]
    assert edited(shown, _working_tree, _working_tree, {path}) == []


def test_a_range_of_commits_is_read():
    assert changed_shown("HEAD..HEAD") == []
    with pytest.raises(ValueError, match="no-such-revision"):
        changed_shown("no-such-revision")


def test_the_list_file_reads_as_json():
    data = json.loads(LIST.read_text())
    assert set(data) == {"about", "by_hand", "shown"} and WRITE in data["about"]
    assert all(p.startswith(("notebooks/", "labs/")) and (ROOT / p).is_file()
               for nbs in data["shown"].values() for p in nbs)
