"""The course's static site (`make site`, website/build.py), built here from executed notebooks.

The executed copies are made in the test, not taken from an earlier test or `make course`: two lessons
get outputs like a real run's (a plot, a table, a widget, a progress bar), as a folder of stored executed
copies would hold (`make site EXECUTED=dir`, e.g. from a GPU machine); the other notebooks show as
stored, unexecuted. So the test is quick (MkDocs and nbconvert only, no kernel) and needs no other test.

Also here: notebooks stay without outputs through nbstripout, a git filter that `make setup` installs.
"""

import base64
import io
import json
import re
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "website"))
import build as site  # noqa: E402  website/build.py

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "labs").glob("*.ipynb"))
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
pytestmark = pytest.mark.slow  # the site is built once, ~50 s: left out of `make test-quick`


def tiny_png():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2, 1))
    ax.plot([1, 2, 3], [1, 4, 9])
    out = io.BytesIO()
    fig.savefig(out, format="png")
    plt.close(fig)
    return base64.b64encode(out.getvalue()).decode()


def executed_copy(path, png):
    """The stored notebook with outputs on its first code cells: a plot, a table, a widget, a progress bar."""
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    widget = {"model_id": "0" * 32, "version_major": 2, "version_minor": 0}
    code[0]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "[launch] 2 ranks · gloo on CPU\n"}]
    code[1]["outputs"] = [{"output_type": "display_data", "metadata": {},
                           "data": {"image/png": png, "text/plain": "<Figure>"}}]
    code[2]["outputs"] = [{"output_type": "display_data", "metadata": {},
                           "data": {"text/html": "<table id='measured'><tr><td>busbw</td><td>1.5 GB/s</td></tr></table>",
                                    "text/plain": "table"}}]
    code[3]["outputs"] = [
        {"output_type": "display_data", "metadata": {}, "data": {WIDGET_VIEW: widget, "text/plain": "VBox(children=(...))"}},
        {"output_type": "display_data", "metadata": {},
         "data": {WIDGET_VIEW: widget, "text/plain": "100%|##########| 8/8 [00:03<00:00,  2.6it/s]"}}]
    return nb


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    executed = tmp_path_factory.mktemp("executed")
    png = tiny_png()
    shown = [ROOT / "notebooks" / "03_zero_from_scratch.ipynb", ROOT / "labs" / "02_ddp_lab.ipynb"]
    for path in shown:
        (executed / path.name).write_text(json.dumps(executed_copy(path, png)))
    out = tmp_path_factory.mktemp("site") / "site"
    sources = site.build(out, executed=executed, folders=[])
    return out, sources, shown


def test_every_lesson_and_lab_has_a_page(built):
    out, sources, shown = built
    for path in NOTEBOOKS:
        page = out / path.parent.name / (path.stem + ".html")
        assert page.is_file(), f"no page for {path.name}"
        text = page.read_text()
        assert "This page:" in text
        if path in shown:
            assert "executed copy from" in text
        else:
            assert "not executed" in text, f"{path.name}: an unexecuted page must say so"
    assert (out / "index.html").is_file() and (out / "labs" / "index.html").is_file()


def test_navigation_follows_the_course_map(built):
    out, _, _ = built
    index = (out / "index.html").read_text()
    start = index.index('<nav class="md-nav md-nav--primary"')
    nav = index[start:index.index("md-sidebar--secondary", start)]  # the site's navigation, nested lists and all
    linked = re.findall(r'href="((?:notebooks|labs)/[^"#]+\.html)"', nav)
    readme = (ROOT / "README.md").read_text()
    in_map = [link.replace(".ipynb", ".html") for _, links in site.course_map(readme) for link in links]
    assert in_map, "the README's course map names no notebook"
    order = [link for link in dict.fromkeys(linked) if link in in_map]
    assert order == list(dict.fromkeys(in_map)), "the navigation lists the course map's notebooks in its order"
    for path in NOTEBOOKS:
        assert f"{path.parent.name}/{path.stem}.html" in linked, f"{path.name} is missing from the navigation"
    assert "Teaching" in nav and "TEACHING" in nav, "the teacher's guide (TEACHING.md) is in the navigation"


def test_outputs_show_and_widgets_fall_back(built):
    out, _, shown = built
    for path in shown:
        text = (out / path.parent.name / (path.stem + ".html")).read_text()
        assert re.search(r'<img[^>]+src="data:image/png;base64,', text), f"{path.name}: the plot is missing"
        assert "id=\"measured\"" in text or "id='measured'" in text, f"{path.name}: the table is missing"
        assert "An interactive widget is here in JupyterLab" in text, f"{path.name}: no static fallback for a widget"
        assert "8/8 [00:03" in text, f"{path.name}: the progress bar's text is missing"
        assert WIDGET_VIEW not in text and "[launch] 2 ranks" in text


class Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        for name in ("href", "src"):
            if attrs.get(name) and not (tag == "a" and name == "src"):
                self.links.append(attrs[name])


def test_no_internal_link_is_broken(built):
    out, _, _ = built
    broken = []
    for page in out.rglob("*.html"):
        if page.name == "404.html":  # served at whatever address was not found: its links are absolute
            continue
        parser = Links()
        parser.feed(page.read_text())
        for link in parser.links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith(("#", "data:", "mailto:")):
                continue
            target = (page.parent / unquote(parts.path)).resolve()
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                broken.append(f"{page.relative_to(out)} -> {link}")
    assert not broken, f"{len(broken)} broken internal link(s):\n" + "\n".join(sorted(set(broken))[:40])


def test_widget_outputs_become_text_or_a_note():
    nb = {"cells": [{"cell_type": "code", "outputs": [
        {"output_type": "display_data", "data": {WIDGET_VIEW: {}, "text/plain": " 50%|#####     | 4/8"}},
        {"output_type": "display_data", "data": {WIDGET_VIEW: {}, "text/plain": "HBox(children=(...))"}}]}],
        "metadata": {"widgets": {"state": {}}}}
    first, second = site.static_widgets(nb)["cells"][0]["outputs"]
    assert first == {"output_type": "stream", "name": "stderr", "text": " 50%|#####     | 4/8"}
    assert "interactive widget" in second["data"]["text/html"] and "widgets" not in nb["metadata"]


# ------------------------------------------------------------------ outputs never reach git


def test_git_strips_notebook_outputs_with_nbstripout():
    attributes = (ROOT / ".gitattributes").read_text()
    assert "*.ipynb filter=nbstripout" in attributes, ".gitattributes must send notebooks through nbstripout"
    makefile = (ROOT / "Makefile").read_text()
    assert "nbstripout --install --attributes .gitattributes" in makefile, "`make setup` installs the git filter"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_nbstripout_leaves_stored_notebooks_as_they_are(path):
    """git's filter must give back a stored notebook byte for byte, or every notebook shows as modified; a cell
    without an id would get a new random one on every `git add`. `make strip` writes notebooks in that form."""
    import nbformat
    from nbstripout import strip_output

    text = path.read_text(encoding="utf-8")
    missing = sum("id" not in c for c in json.loads(text)["cells"])
    assert not missing, f"{path.name}: {missing} cell(s) without an id: run `make strip`"
    nb = nbformat.reads(text, as_version=nbformat.NO_CONVERT)  # what the filter does, in this process
    stripped = nbformat.writes(strip_output(nb, keep_output=False, keep_count=False, keep_id=True))
    assert stripped.rstrip("\n") + "\n" == text, f"nbstripout would rewrite {path.name} (key order?): run `make strip`"
