"""The course's static site (`make site`) as a reader meets it: served on localhost, opened in headless Chromium.

`make browser-test` installs what this needs (see test_lab.py). The site is built here (website/build.py, about
30 s) with one executed copy planted: lesson 01b (the ring all-reduce, which has the most math) with a
three-panel plot 1107 px wide, as lesson 02a draws. Then, on that page, in a 1920 x 1080 window:

- the math is rendered: MathML elements (website/hooks.py renders the TeX when the site is built) with a size,
  and no raw TeX (`$...$`, `\\(`, `\\frac`) in the text a reader sees;
- the title is whole: a heading with inline code ("Against `dist.all_reduce`") keeps it in the table of
  contents, and lesson 10's title keeps its `torchrun`;
- a Markdown cell is at most 50rem wide, while outputs take the width they need;
- lesson 15's display formula is MathML laid out as `block math`: centred, its fraction stacked, not clipped;
- the plot is drawn at its own width (1107 px), not shrunk, as the content column is wider;
- no request leaves localhost (Playwright's request events: fonts, scripts, stylesheets, images).

The screenshot is build/browser/site-page.png.
"""

import base64
import functools
import http.server
import io
import json
import sys
import threading
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from test_lab import CHROMIUM, CHROMIUM_ARGS, SHOTS, playwright_api  # skips this module as test_lab does

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "website"))
import build as site  # noqa: E402  website/build.py

pytestmark = pytest.mark.browser
LESSON = ROOT / "notebooks" / "01b_ring_all_reduce.ipynb"
PLOT_WIDTH = 1107  # px: lesson 02a's three panels (figsize 11.07 x 3 at 100 dpi)


def wide_plot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(PLOT_WIDTH / 100, 3), dpi=100)
    for k, ax in enumerate(axes):
        ax.plot(range(8), [x ** (k + 1) for x in range(8)])
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=100)
    plt.close(fig)
    return base64.b64encode(out.getvalue()).decode()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The site built with 01b's planted plot, served by http.server on a free port of 127.0.0.1."""
    executed = tmp_path_factory.mktemp("executed")
    nb = json.loads(LESSON.read_text())
    code = next(c for c in nb["cells"] if c["cell_type"] == "code")
    code["outputs"] = [{"output_type": "display_data", "metadata": {},
                        "data": {"image/png": wide_plot(), "text/plain": "<Figure size 1107x300 with 3 Axes>"}}]
    (executed / LESSON.name).write_text(json.dumps(nb))
    out = tmp_path_factory.mktemp("site") / "site"
    site.build(out, executed=executed, folders=[])
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(out))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_lesson_page_renders_offline(served):
    SHOTS.mkdir(parents=True, exist_ok=True)
    with playwright_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = chromium.new_page(viewport={"width": 1920, "height": 1080})
            requested = []
            page.on("request", lambda request: requested.append(request.url))
            page.goto(f"{served}/notebooks/{LESSON.stem}.html", wait_until="networkidle")

            maths = page.locator("article math")
            sizes = maths.evaluate_all("ms => ms.map(m => m.getBoundingClientRect().width)")
            assert len(sizes) > 50 and min(sizes) > 0, f"{len(sizes)} <math> elements, narrowest {min(sizes, default=0)}"
            prose = page.evaluate("""() => {
                const a = document.querySelector('article').cloneNode(true);
                a.querySelectorAll('pre, code, math, script, style, .clipboard-copy-txt').forEach(e => e.remove());
                return a.innerText; }""")
            raw = [t for t in ("$", "\\(", "\\[", "\\frac", "\\Psi", "\\cdot") if t in prose]
            assert not raw, f"raw TeX on the page: {raw}"

            # 01b's title has no code; a heading of it has: "Is it right? Against `dist.all_reduce`", in the page
            # and in the table of contents beside it (mkdocs-jupyter's entry read "Is it right? Against ")
            against = page.locator("article h3", has_text="Is it right? Against").first
            assert against.locator("code").inner_text() == "dist.all_reduce", against.inner_text()
            entry = page.locator(".md-nav--secondary .md-nav__link", has_text="Is it right? Against").first
            assert entry.inner_text().strip().startswith("Is it right? Against dist.all_reduce,"), entry.inner_text()
            assert entry.get_attribute("href") == "#" + against.get_attribute("id")

            # prose at a readable measure, outputs as wide as they need
            prose_width = page.locator("article .jp-MarkdownCell").first.evaluate("""c => {
                const s = getComputedStyle(c), px = k => parseFloat(s[k]);
                const content = c.getBoundingClientRect().width - px('paddingLeft') - px('paddingRight')
                                - px('borderLeftWidth') - px('borderRightWidth');
                return [content, content / parseFloat(getComputedStyle(document.documentElement).fontSize)]; }""")
            assert prose_width[1] <= 50.01, f"a Markdown cell's text {prose_width[1]:.1f} rem wide"

            image = page.locator("article .jp-OutputArea-output img").first
            image.scroll_into_view_if_needed()
            natural, shown, column = image.evaluate("""i => [i.naturalWidth, i.getBoundingClientRect().width,
                i.closest('.jp-OutputArea-output').getBoundingClientRect().width]""")
            assert natural == PLOT_WIDTH, natural
            assert abs(shown - min(natural, column)) <= 1, f"a {natural}-px plot shown {shown:.0f} px in {column:.0f}"
            assert shown >= PLOT_WIDTH - 1, f"the content column ({column:.0f} px) is narrower than the plot at 1920 px"
            assert column > prose_width[0], f"outputs ({column:.0f} px) no wider than the prose ({prose_width[0]:.0f} px)"

            page.locator("article math").first.scroll_into_view_if_needed()
            # animations disabled: Material's header fades its title in on scroll, caught half-drawn otherwise
            page.screenshot(path=SHOTS / "site-page.png", animations="disabled")

            # lesson 10's title has inline code ("... machine: `torchrun`, two nodes ..."), which
            # mkdocs-jupyter's title dropped
            page.goto(f"{served}/notebooks/10_torchrun_and_slurm.html", wait_until="networkidle")
            heading = page.locator("article h1").first
            assert heading.locator("code").inner_text() == "torchrun", heading.inner_text()
            assert page.title().startswith(heading.inner_text().rstrip("¶").strip() + " - "), page.title()
            assert page.title().startswith("10 · Beyond one machine: torchrun, two nodes, and Slurm - "), page.title()

            # a display formula drawn as MathML: lesson 15's load-balancing loss, centred, its fractions stacked
            # (taller than a line of text) and not clipped by its scroll box
            page.goto(f"{served}/notebooks/15_expert_parallelism.html", wait_until="networkidle")
            formula = page.locator('article math[display="block"]', has_text="argmax").first
            formula.scroll_into_view_if_needed()
            shape = formula.evaluate("""m => {
                const box = m.getBoundingClientRect(), row = m.firstElementChild.getBoundingClientRect();
                const frac = m.querySelector('mfrac').getBoundingClientRect();
                return {display: getComputedStyle(m).display, em: parseFloat(getComputedStyle(m).fontSize),
                        frac: frac.height, left: row.left - box.left, right: box.right - row.right,
                        scroll: m.scrollHeight, client: m.clientHeight, text: m.textContent}; }""")
            assert shape["display"] == "block math", shape
            assert shape["frac"] > 1.5 * shape["em"], f"a display fraction {shape['frac']:.0f} px tall, font {shape['em']} px"
            assert abs(shape["left"] - shape["right"]) <= 2, f"not centred: {shape}"
            assert shape["scroll"] <= shape["client"], f"clipped: content {shape['scroll']} px in {shape['client']} px"
            assert "\\" not in shape["text"] and "argmax" in shape["text"], shape["text"]
            away = sorted({u for u in requested if urlsplit(u).hostname not in ("127.0.0.1",)
                           and not u.startswith("data:")})
            assert not away, f"requests that leave localhost: {away}"
            assert any(u.endswith(".css") for u in requested), "the page's own stylesheets were requested"
        finally:
            chromium.close()
