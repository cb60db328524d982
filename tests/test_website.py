"""The course's static site (`make site`, website/build.py), built here from executed notebooks.

The executed copies are made in the test, not taken from an earlier test or `make course`: two lessons
get outputs like a real run's (a plot, a table, a widget, a progress bar), as a folder of stored executed
copies would hold (`make site EXECUTED=dir`, e.g. from a GPU machine); the other notebooks show as
stored, unexecuted. So the test is quick (MkDocs and nbconvert only, no kernel) and needs no other test.

Also here: notebooks stay without outputs through nbstripout, a git filter that `make setup` installs.
"""

import base64
import html
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
    assert 'href="notebooks/cheatsheet.html"' in nav, "the cheatsheet is in the navigation"


def test_the_cheatsheet_is_a_page_with_its_math_and_its_lessons_linked(built):
    out, _, _ = built
    source = (ROOT / site.CHEATSHEET).read_text()
    text = (out / "notebooks" / "cheatsheet.html").read_text()
    _, maths, _ = page_facts(text)
    formulas = len(re.findall(r"\$[^$\n]+\$", source))
    assert maths >= formulas > 40, f"the cheatsheet's page has {maths} <math> elements for {formulas} formulas"
    lessons = set(re.findall(r"\]\(([^)]+)\.ipynb\)", source))
    assert lessons and lessons <= set(re.findall(r'href="([^"#/]+)\.html"', text)), "a lesson link is not a page link"


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


# ------------------------------------------------------------------ the site renders offline


class Prose(HTMLParser):
    """A page's visible prose (not code, scripts, styles or rendered math), the number of <math> elements, and
    every address the browser would load by itself: stylesheets, scripts, fonts, images (their srcset too),
    frames; the text of <style> elements and style="" attributes (their url()s load too); and each element of
    class "mermaid", for which Material's script loads mermaid from unpkg.com (its bundle's "pre.mermaid")."""

    SKIP = {"pre", "code", "script", "style", "textarea", "math", "svg"}
    LOADS = {("link", "href"), ("script", "src"), ("img", "src"), ("source", "src"), ("iframe", "src"),
             ("video", "src"), ("audio", "src"), ("embed", "src"), ("object", "data")}

    def __init__(self):
        super().__init__()
        self.text, self.maths, self.loads, self.styles, self.skipping, self.hidden = [], 0, [], [], [], 0
        self.mermaid = 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.maths += tag == "math"
        self.loads += [attrs[name] for t, name in self.LOADS if t == tag and attrs.get(name)]
        self.loads += [src.split()[0] for src in (attrs.get("srcset") or "").split(",") if src.strip()]
        self.styles += [attrs["style"]] if attrs.get("style") else []
        self.mermaid += "mermaid" in (attrs.get("class") or "").split()
        if tag in self.SKIP:
            self.skipping.append(tag)
        if tag == "div" and "clipboard-copy-txt" in (attrs.get("class") or ""):  # mkdocs-jupyter's copy of the code
            self.hidden = 1
        elif tag == "div" and self.hidden:
            self.hidden += 1

    def handle_endtag(self, tag):
        if self.skipping and tag == self.skipping[-1]:
            self.skipping.pop()
        if tag == "div" and self.hidden:
            self.hidden -= 1

    def handle_data(self, data):
        if self.skipping and self.skipping[-1] in ("style", "script"):
            self.styles.append(data)
        elif not self.skipping and not self.hidden:
            self.text.append(data)


#: TeX a reader would see raw: $...$, $$...$$, \(...\), \[...\], or a TeX command such as \frac
RAW_TEX = re.compile(r"\$[^$\s][^$]*\$|\\[(\[]|\\(?:frac|sum|text|cdot|Psi|log|times|approx|lceil)\b")
REMOTE = re.compile(r"^(?:https?:)?//", re.I)


def css_remote(css):
    """The other hosts' addresses a stylesheet (or a script's import()) loads: url(...), @import "...", import(...)."""
    found = re.findall(r"""url\(\s*['"]?((?:https?:)?//[^)'"]+)|@import\s+['"]((?:https?:)?//[^'"]+)"""
                       r"""|import\(\s*['"]((?:https?:)?//[^'"]+)""", css)
    return [address for groups in found for address in groups if address]


def page_facts(text):
    parser = Prose()
    parser.feed(text)
    prose = " ".join(parser.text)
    remote = [a for a in parser.loads if REMOTE.match(a)]
    remote += css_remote(" ".join(parser.styles))
    remote += ["a mermaid diagram (class=\"mermaid\": Material loads mermaid from unpkg.com)"] * parser.mermaid
    return prose, parser.maths, remote


def test_the_checks_catch_a_planted_page():
    """The checks below must be able to fail: raw TeX, a remote font, and the renderer's output."""
    import hooks  # website/hooks.py

    planted = ('<link rel="stylesheet" href="https://fonts.googleapis.com/css?family=Roboto">'
               r'<p>the ring sends $\frac{p-1}{p}S$ bytes, \(p-1\) steps</p><pre>echo $HOME $PATH</pre>')
    prose, maths, remote = page_facts(planted)
    assert RAW_TEX.findall(prose) == [r"$\frac{p-1}{p}S$", "\\("] and maths == 0
    assert remote == ["https://fonts.googleapis.com/css?family=Roboto"]
    more = page_facts('<img src="a.png" srcset="a2.png 2x, https://cdn.example/a3.png 3x">'
                      '<div style="background: url(//cdn.example/bg.png)"></div><pre class="mermaid">graph LR</pre>'
                      '<style>@import "https://fonts.example/f.css";</style>')[2]
    assert more[:3] == ["https://cdn.example/a3.png", "//cdn.example/bg.png", "https://fonts.example/f.css"], more
    assert len(more) == 4 and "mermaid" in more[3], more
    assert css_remote("@import url('https://x.example/a.css'); @import 'local.css'") == ["https://x.example/a.css"]
    prose, maths, _ = page_facts(hooks.render_tex(planted))
    assert not RAW_TEX.search(prose) and maths == 2, prose
    assert "echo $HOME $PATH" in hooks.render_tex(planted), "TeX-like text in code is left alone"
    with pytest.raises(ValueError, match=r"page\.ipynb: latex2mathml cannot render the TeX 'x\^' \(Missing"):
        hooks.render_tex("<p>$x^$</p>", "page.ipynb")  # a superscript with nothing to raise
    # TeX latex2mathml does not know comes back as text (<mi>\arg</mi>, drawn as "\arg"): it stops the build too
    with pytest.raises(ValueError, match=r"page\.ipynb: latex2mathml left '>\\\\arg' of the TeX '\\\\arg\\\\max p'"):
        hooks.render_tex(r"<p>$$\arg\max p$$</p>", "page.ipynb")
    with pytest.raises(ValueError, match=r"left '<mi>&</mi>' of the TeX 'a & b'"):
        hooks.render_tex("<p>$a & b$</p>", "page.ipynb")
    assert "<mo>argmax</mo>" in hooks.render_tex(r"<p>$\operatorname{argmax} p$</p>")  # what to write instead


def test_math_is_rendered_and_no_tex_is_left(built):
    out, _, _ = built
    raw, rendered = [], {}
    for page in sorted(out.rglob("*.html")):
        prose, maths, _ = page_facts(page.read_text())
        raw += [f"{page.relative_to(out)}: {tex!r}" for tex in RAW_TEX.findall(prose)]
        rendered[page.relative_to(out).as_posix()] = maths
    assert not raw, f"{len(raw)} raw TeX formula(s) on the site:\n" + "\n".join(raw[:20])
    for path in NOTEBOOKS:  # a notebook whose Markdown has $...$ gets at least that many formulas on its page
        nb = json.loads(path.read_text())
        formulas = sum(len(re.findall(r"\$[^$\n]+\$", "".join(c["source"]))) for c in nb["cells"]
                       if c["cell_type"] == "markdown")
        page = f"{path.parent.name}/{path.stem}.html"
        assert rendered[page] >= formulas, f"{page}: {rendered[page]} <math> elements for {formulas} formulas"
    assert rendered["notebooks/01b_ring_all_reduce.html"] > 50


def test_no_page_loads_anything_from_another_host(built):
    out, _, _ = built
    remote = []
    for page in sorted(out.rglob("*.html")):
        remote += [f"{page.relative_to(out)}: {a}" for a in page_facts(page.read_text())[2]]
    for css in sorted(out.rglob("*.css")):
        remote += [f"{css.relative_to(out)}: {address}" for address in css_remote(css.read_text())]
    assert not remote, f"{len(remote)} request(s) to another host:\n" + "\n".join(sorted(set(remote))[:20])


def test_a_notebook_page_is_titled_by_its_first_heading_with_its_code(built):
    out, _, _ = built
    for path in NOTEBOOKS:
        text = (out / path.parent.name / (path.stem + ".html")).read_text()
        title = html.unescape(re.search(r"<title>(.*?) - Distributed", text, re.S).group(1))
        h1 = re.search(r"<h1[^>]*>(.*?)<a class=\"anchor-link\"", text, re.S).group(1)  # nbconvert's, with <code>
        assert title == html.unescape(re.sub(r"<[^>]+>", "", h1)).strip(), f"{path.name}: title {title!r}, h1 {h1!r}"
        ids = set(re.findall(r'\bid="([^"]+)"', text))
        toc = text[text.index('<nav class="md-nav md-nav--secondary"'):]
        toc = toc[:toc.index("</nav>")]
        entries = re.findall(r'<a href="#([^"]+)" class="md-nav__link"', toc)
        assert entries, f"{path.name}: no table of contents"
        missing = [a for a in entries if unquote(a) not in ids]
        assert not missing, f"{path.name}: table-of-contents links to no heading: {missing}"
    page = (out / "notebooks" / "10_torchrun_and_slurm.html").read_text()
    assert "<title>10 · Beyond one machine: torchrun, two nodes, and Slurm - " in page
    page = (out / "notebooks" / "01b_ring_all_reduce.html").read_text()
    assert re.search(r'<a href="#is-it-right-against-distall_reduce[^"]*" class="md-nav__link">\s*'
                     r'<span class="md-ellipsis">\s*Is it right\? Against <code>dist.all_reduce</code>', page)


def banner(page):
    """The text of a notebook page's banner, <p class="page-source"> (website/build.py); AssertionError if none."""
    found = re.findall(r'<p class="page-source">(.*?)</p>', page, re.S)
    assert len(found) == 1, f"{len(found)} banners"
    return html.unescape(re.sub(r"<[^>]+>", "", found[0]))


def test_the_banner_says_not_executed_only_without_outputs(built):
    out, _, _ = built
    # the phrase counts only inside the banner: a page saying "not executed" in its prose has no banner
    with pytest.raises(AssertionError, match="0 banners"):
        banner("<p>This cell is not executed.</p>")
    assert banner('<p class="page-source">This page: <b>not executed</b>: no outputs.</p>').startswith(
        "This page: not executed")
    for path in NOTEBOOKS:
        text = (out / path.parent.name / (path.stem + ".html")).read_text()
        outputs = len(re.findall(r'class="[^"]*\bjp-OutputArea-output\b', text))
        said = banner(text)
        assert ("not executed" in said) == (outputs == 0), f"{path.name}: {outputs} outputs, banner {said!r}"


def test_a_saved_notebook_with_outputs_is_not_called_unexecuted(tmp_path):
    path = ROOT / "notebooks" / "00_start_here.ipynb"
    nb = json.loads(path.read_text())
    saved = tmp_path / "notebooks" / path.name
    saved.parent.mkdir()
    saved.write_text(json.dumps(nb))
    assert site.find_executed(saved, None, folders=[]) == (saved, site.SOURCES["stored"])
    next(c for c in nb["cells"] if c["cell_type"] == "code")["outputs"] = [
        {"output_type": "stream", "name": "stdout", "text": "[launch] 2 ranks\n"}]
    saved.write_text(json.dumps(nb))
    shown, label = site.find_executed(saved, None, folders=[])
    assert shown == saved and label == site.SOURCES["saved"] and "not executed" not in label


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
