"""MkDocs hooks for the course site: links between notebook pages, math as MathML, whole titles, nothing remote.

- Links: MkDocs rewrites the links of Markdown pages (``notebooks/01_collectives.ipynb`` becomes
  ``notebooks/01_collectives.html``), but a notebook page is HTML from nbconvert, which it leaves alone: here
  its relative links to ``.ipynb`` files and to ``README.md`` are turned into the pages' addresses.
- Math: TeX (``$...$``, ``$$...$$``, ``\\(...\\)``, ``\\[...\\]``; on Markdown pages pymdownx.arithmatex's
  generic output, which is ``\\(...\\)``) becomes MathML when the site is built, with latex2mathml (pure
  Python). Browsers draw MathML themselves, so a page needs no script, no font and no network for its math.
  TeX inside ``pre``, ``code``, ``script`` and ``style`` is left as it is. The build stops, naming the page and
  the formula, where latex2mathml raises an error, and where it returns MathML with TeX left in it: a command it
  does not know (``\\arg``) passes through as the text ``<mi>\\arg</mi>``, a stray ``&`` as ``<mi>&</mi>``.
  This runs on the finished page, so the table of contents beside it (headings with TeX) is rendered too; a
  page's <title> stays text.
- nbconvert's page head asks for MathJax (``<script src="">`` when no address is set: mkdocs-jupyter's
  ``custom_mathjax_url`` is empty) and carries a module that would import mermaid from a CDN if a page had a
  diagram (none does): both are removed, so a notebook page makes no request to another host.
- Titles: mkdocs-jupyter takes a notebook page's title from its table of contents, where inline code is
  dropped ("10 · Beyond one machine: , two nodes, and Slurm"); here it is the text of the page's first <h1>, as
  nbconvert rendered it, code and emphasis included; so is each entry of the page's table of contents, with
  the heading's own id (mkdocs-jupyter's ids, made without the code, pointed nowhere).
"""

import html
import re

from latex2mathml.converter import convert as tex_to_mathml

LINK = re.compile(r'(href=")(?![a-z][a-z0-9+.-]*:|#|/)([^"#?]*?)(\.ipynb|README\.md)([#?][^"]*)?"')
#: text that is not prose, left as it is: code (and mkdocs-jupyter's hidden copy of each code cell for its copy
#: button), scripts, styles, comments, and math already rendered
VERBATIM = re.compile(r"<!--.*?-->|<(pre|code|script|style|textarea|math|svg|title)\b.*?</\1>"
                      r"|<div class=\"clipboard-copy-txt\".*?</div>", re.S)
TAG = re.compile(r"<[a-zA-Z/](?:[^>\"']|\"[^\"]*\"|'[^']*')*>")
#: display math ($$...$$, \[...\]), then inline (\(...\), $...$: no space just inside the dollars, no digit after)
TEX = re.compile(r"\$\$(?P<d1>.+?)\$\$|\\\[(?P<d2>.+?)\\\]|\\\((?P<i1>.+?)\\\)"
                 r"|(?<![\\$])\$(?P<i2>[^\s$](?:[^$]*?[^\s$\\])?)\$(?!\d)", re.S)
#: TeX that latex2mathml passed through as text: a backslash command as an element's text, or a lone &
LEAKED = re.compile(r">\\[A-Za-z]+|<mi>&(?:amp;)?</mi>")
NB_HEAD_SCRIPTS = re.compile(r"<!-- Load mathjax -->.*?<!-- End of mathjax configuration -->"
                             r"|<script type=\"module\">(?:(?!</script>).)*?mermaid(?:(?!</script>).)*</script>", re.S)


def page_link(match):
    prefix, path, suffix, rest = match.group(1), match.group(2), match.group(3), match.group(4) or ""
    target = path + (".html" if suffix == ".ipynb" else "index.html")
    return f'{prefix}{target}{rest}"'


def render_tex(text: str, where: str = "a page") -> str:
    """``text`` (HTML) with every TeX formula in its prose replaced by MathML; code and scripts left alone."""
    def one(match):
        display = match.group("d1") or match.group("d2")
        tex = html.unescape(display or match.group("i1") or match.group("i2")).strip()
        try:
            mathml = tex_to_mathml(tex, display="block" if display else "inline")
        except Exception as error:  # latex2mathml raises its own errors, and others on odd input
            raise ValueError(f"{where}: latex2mathml cannot render the TeX {tex!r} ({type(error).__name__}: "
                             f"{error}); write it in the TeX latex2mathml reads, or put it in `code`") from error
        leaked = LEAKED.search(mathml)
        if leaked:
            raise ValueError(f"{where}: latex2mathml left {leaked.group(0)!r} of the TeX {tex!r} as text in its "
                             "MathML (a command it does not know, or a stray &); write it in the TeX latex2mathml "
                             r"reads (\operatorname{argmax}, a Unicode symbol such as 𝟙), or put it in `code`")
        return mathml

    def prose(part):  # TeX is looked for between tags only, never across one
        return "".join(TEX.sub(one, piece) if i % 2 == 0 else piece
                       for i, piece in enumerate(re.split(f"({TAG.pattern})", part)))

    out, last = [], 0
    for kept in VERBATIM.finditer(text):
        out += [prose(text[last:kept.start()]), kept.group(0)]
        last = kept.end()
    out.append(prose(text[last:]))
    return "".join(out)


def first_heading(content: str):
    """The text of the page's first <h1> as nbconvert wrote it (its <code> and <em> as their text); None if none."""
    h1 = re.search(r"<h1\b[^>]*>(.*?)</h1>", content, re.S)
    if h1 is None:
        return None
    return html.unescape(re.sub(r"<[^>]+>", "", re.sub(r"<a class=\"anchor-link\".*?</a>", "", h1.group(1)))).strip()


HEADING = re.compile(r"<h([1-6])\b[^>]*\bid=\"([^\"]+)\"[^>]*>(.*?)</h\1>", re.S)


def toc_from_headings(toc, content: str):
    """mkdocs-jupyter's table of contents, each entry given its heading's id and HTML as nbconvert wrote them.

    Its entries come from the Markdown with inline code dropped, so "Is it right? Against `dist.all_reduce`" was
    listed as "Is it right? Against " and linked to an id the page does not have. Entries and headings are in the
    same order: each entry takes the next heading of its level."""
    headings = [(int(level), hid, re.sub(r"<a class=\"anchor-link\".*?</a>", "", inner).strip())
                for level, hid, inner in HEADING.findall(content)]

    def walk(links):
        for link in links:
            yield link
            yield from walk(link.children)

    position = 0
    for link in walk(toc):
        while position < len(headings) and headings[position][0] != link.level:
            position += 1
        if position == len(headings):
            return  # fewer headings than entries: the rest keep mkdocs-jupyter's text
        _, link.id, link.title = headings[position]
        position += 1


def on_page_content(content, page, config, files):  # noqa: ARG001 - MkDocs' hook signature
    if page.file.src_uri.endswith(".ipynb"):
        content = NB_HEAD_SCRIPTS.sub("", LINK.sub(page_link, content))
        page.title = first_heading(content) or page.title
        toc_from_headings(page.toc, content)
    return content


def on_post_page(output, page, config):  # noqa: ARG001 - MkDocs' hook signature
    """Math everywhere on the finished page: its content, and the table of contents beside it (headings with TeX)."""
    return render_tex(output, page.file.src_uri)
