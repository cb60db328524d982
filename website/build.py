"""Build the course's static site (``make site``): every lesson and lab as a page, with its outputs.

The tool is MkDocs with mkdocs-jupyter (notebooks as pages, through nbconvert) and the Material theme:
all three are pure Python on PyPI, so the site builds wherever the course installs, with no network at
build time. (Jupyter Book 2 / MyST needs node and fetches its site template from the web when it builds;
Quarto is a separate binary, not a Python package.)

Which executed copy of a notebook becomes its page, first found wins:

1. ``--executed DIR`` (``make site EXECUTED=DIR``): stored executed copies, e.g. ``build/course/`` copied
   back from a GPU machine, so the site shows GPU outputs without the builder having a GPU;
2. ``build/course/``: ``make course``, every notebook with its full parameters;
3. ``build/test/ws2/``: the test suite's papermill runs (small parameters, 2 ranks);
4. the notebook as it is on disk: as stored in git, with no outputs (the page says "not executed"), or with
   the outputs it was saved with in JupyterLab (the page says so). Nothing is executed here:
   ``make site-executed`` runs ``make course`` first.

Each page starts with a line saying which of these it shows. Navigation follows the course map (the table
of README.md), after the home page and the cheatsheet (``notebooks/cheatsheet.md``, the formulas on one page):
each lesson, then its lab; a notebook the table does not name is listed after it. Widgets
need a live kernel, so a widget's output becomes a note saying so (the lessons draw or print the widget's
default right after it); a progress bar keeps its text.

    python website/build.py [--executed DIR] [--out build/site] [--strict]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_NOTE = ("<p class=\"widget-note\"><em>An interactive widget is here in JupyterLab (it needs a running "
               "kernel); the output below it shows its default.</em></p>")
SOURCES = {"course": "executed with the lesson's full parameters (<code>make course</code>)",
           "ws2": "executed with the test suite's small parameters on 2 ranks",
           "stored": "<b>not executed</b>: no outputs (run <code>make site-executed</code>)",
           "saved": "the notebook as saved in this copy of the course, with the outputs it was saved with"}


#: the learners' one page of formulas (Markdown, not a notebook): a page of its own, first after the home page
CHEATSHEET = "notebooks/cheatsheet.md"


def course_notebooks():
    return sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "labs").glob("*.ipynb"))


#: where executed copies are looked for after --executed, in order, with what the page then says
FOLDERS = [(ROOT / "build" / "course", SOURCES["course"]), (ROOT / "build" / "test" / "ws2", SOURCES["ws2"])]


def has_outputs(path: Path) -> bool:
    return any(c.get("outputs") for c in json.loads(path.read_text())["cells"])


def find_executed(path: Path, executed: Path | None, folders=None):
    """(the notebook to show, where it came from): the first executed copy found, else the stored one (which says
    whether it has outputs: one run in JupyterLab and saved keeps them on disk until git's filter strips them)."""
    candidates = ([(executed, f"executed copy from {executed.name}/")] if executed else [])
    for folder, label in candidates + (FOLDERS if folders is None else folders):
        for copy in (folder / path.parent.name / path.name, folder / path.name):  # as make course writes, or flat
            if copy.is_file() and has_outputs(copy):
                return copy, label
    return path, SOURCES["saved" if has_outputs(path) else "stored"]


def static_widgets(nb: dict) -> dict:
    """Replace each widget output by its text (a progress bar) or by a note (a widget needs a kernel)."""
    for cell in nb["cells"]:
        outputs = []
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if WIDGET_VIEW in data:
                text = "".join(data.get("text/plain", ""))
                if re.match(r"\s*\d+%\|", text):  # tqdm's text form: "100%|####| 8/8 [...]"
                    out = {"output_type": "stream", "name": "stderr", "text": text}
                else:
                    out = {"output_type": "display_data", "metadata": {}, "data": {"text/html": WIDGET_NOTE}}
            outputs.append(out)
        if "outputs" in cell:
            cell["outputs"] = outputs
    nb.get("metadata", {}).pop("widgets", None)
    return nb


def course_map(readme: str):
    """[(title, [links to notebooks])] from the course map table of README.md, in its order."""
    rows = []
    for line in readme.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and re.fullmatch(r"\d\d[a-z]?", cells[0]):  # 07a, 07b: a lesson in parts
            links = re.findall(r"\]\(([^)]+\.ipynb)\)", line)
            name = re.search(r"\[([^\]]+)\]", cells[1])
            rows.append((f"{cells[0]} · {name.group(1) if name else cells[1]}", links))
    return rows


def nav(readme: str, pages: list[str]):
    """MkDocs navigation: home, the cheatsheet, each lesson of the course map then its lab, then any page not in the
    map."""
    entries, seen = [{"Course": "index.md"}, {"Cheatsheet": CHEATSHEET}], set()
    for title, links in course_map(readme):
        for link in links:
            if link in pages and link not in seen:
                label = title if link.startswith("notebooks/") else f"{Path(link).stem.split('_')[0]} · lab"  # 11a, 11b
                entries.append({label: link})
                seen.add(link)
    rest = [p for p in pages if p not in seen]
    if rest:
        entries.append({"More": [{Path(p).stem.replace("_", " "): p} for p in rest]})
    entries.append({"Labs": "labs/README.md"})
    entries.append({"Teaching": "TEACHING.md"})
    return entries


def stage(docs: Path, executed: Path | None, folders=None):
    """Fill ``docs`` with the README as the home page, the notebooks, and the files their pages link to."""
    if docs.exists():
        shutil.rmtree(docs)
    (docs / "notebooks").mkdir(parents=True)
    (docs / "labs").mkdir()
    shutil.copy(ROOT / "README.md", docs / "index.md")
    shutil.copy(ROOT / "labs" / "README.md", docs / "labs" / "README.md")
    shutil.copy(ROOT / "TEACHING.md", docs / "TEACHING.md")  # the teacher's guide (utils/course/teaching_guide.py)
    shutil.copy(ROOT / CHEATSHEET, docs / CHEATSHEET)  # its links to the lessons' .ipynb become their pages
    shutil.copy(HERE / "site.css", docs / "site.css")
    for folder in ("notebooks/scripts", "utils", "labs/solutions"):  # source files the lessons link to
        shutil.copytree(ROOT / folder, docs / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    pages, sources = [], {}
    for path in course_notebooks():
        shown, label = find_executed(path, executed, folders)
        nb = static_widgets(json.loads(shown.read_text()))
        nb["cells"].insert(0, {"cell_type": "markdown", "metadata": {}, "id": "site-source",
                               "source": f'<p class="page-source">This page: {label}.</p>'})
        rel = f"{path.parent.name}/{path.name}"
        (docs / rel).write_text(json.dumps(nb, ensure_ascii=False))
        pages.append(rel)
        sources[rel] = label
    return pages, sources


def build(out: Path, executed: Path | None = None, strict: bool = False, folders=None) -> dict:
    """Stage the notebooks, write mkdocs.yml, run MkDocs into ``out``; returns {page: where it came from}.
    ``folders``: [(folder, what the page says)] to look in after ``executed`` (default ``FOLDERS``)."""
    work = out.parent / (out.name + "-src")
    pages, sources = stage(work / "docs", executed, folders)
    config = {
        "site_name": "Distributed deep-learning training, by doing",
        "docs_dir": "docs", "site_dir": str(out.resolve()),
        "use_directory_urls": False,  # notebooks/01_collectives.html: the lessons' own links then work
        # font: false: Material's default asks fonts.googleapis.com for Roboto (its base.html, block "fonts"); the
        # site uses the system's fonts, so a page makes no request to another host and reads the same offline.
        "theme": {"name": "material", "font": False, "features": ["navigation.sections", "navigation.footer"]},
        "extra_css": ["site.css"],
        "hooks": [str(HERE / "hooks.py")],
        # Only notebooks become pages: the .py files the lessons link to (scripts, utils, solutions) are copied as
        # they are, so a link opens the source itself. mkdocs-jupyter's default ("*.py" too) rendered each one
        # through nbconvert as well: 161 more pages, 58% of the build's CPU time (103 s -> 43 s, measured).
        "plugins": [{"mkdocs-jupyter": {"include": ["*.ipynb"], "include_source": True, "ignore_h1_titles": False,
                                        "include_requirejs": False, "execute": False}}],
        # arithmatex keeps a Markdown page's TeX out of Markdown's hands; generic: its plain \(...\) form, which
        # hooks.py renders as MathML with every notebook page's TeX
        "markdown_extensions": ["tables", "attr_list", "md_in_html", {"pymdownx.arithmatex": {"generic": True}}],
        "validation": {"links": {"not_found": "warn", "anchors": "ignore"}},
        "nav": nav((ROOT / "README.md").read_text(), pages),
    }
    (work / "mkdocs.yml").write_text(json.dumps(config, indent=1))  # JSON is YAML
    cmd = [sys.executable, "-m", "mkdocs", "build", "--quiet", "--clean", "-f", str(work / "mkdocs.yml")]
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")  # Material's banner about MkDocs 2: we pin MkDocs 1.6
    subprocess.run(cmd + (["--strict"] if strict else []), check=True, cwd=work, env=env)  # caches in cwd/.cache
    return sources


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--executed", type=Path, help="a folder of executed notebooks to prefer (e.g. from a GPU box)")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "site")
    parser.add_argument("--strict", action="store_true", help="MkDocs warnings (e.g. a broken link) fail the build")
    args = parser.parse_args(argv)
    if args.executed and not args.executed.is_dir():
        parser.error(f"--executed {args.executed}: no such folder; give the folder holding the executed .ipynb files")
    sources = build(args.out, args.executed, args.strict)
    width = max(map(len, sources))
    for page, label in sources.items():
        print(f"{page:<{width}}  {re.sub('<[^>]+>', '', label)}")
    print(f"site: {args.out / 'index.html'} ({len(sources)} notebook pages)")


if __name__ == "__main__":
    main()
