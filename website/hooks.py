"""MkDocs hook for the course site: a notebook page's links to other notebooks point at their pages.

MkDocs rewrites the links of Markdown pages (``notebooks/01_collectives.ipynb`` becomes
``notebooks/01_collectives.html``), but a notebook page is HTML from nbconvert, which it leaves alone:
here its relative links to ``.ipynb`` files and to ``README.md`` are turned into the pages' addresses.
"""

import re

LINK = re.compile(r'(href=")(?![a-z][a-z0-9+.-]*:|#|/)([^"#?]*?)(\.ipynb|README\.md)([#?][^"]*)?"')


def page_link(match):
    prefix, path, suffix, rest = match.group(1), match.group(2), match.group(3), match.group(4) or ""
    target = path + (".html" if suffix == ".ipynb" else "index.html")
    return f'{prefix}{target}{rest}"'


def on_page_content(html, page, config, files):  # noqa: ARG001 - MkDocs' hook signature
    if page.file.src_uri.endswith(".ipynb"):
        return LINK.sub(page_link, html)
    return html
