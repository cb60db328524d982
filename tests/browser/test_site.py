"""The course's static site (`make site`) as a reader meets it: served on localhost, opened in headless Chromium.

`make browser-test` installs what this needs (see test_lab.py). The site is built here (website/build.py, about
30 s) with one executed copy planted: lesson 01b (the ring all-reduce, which has the most math) with a
three-panel plot 1107 px wide, as lesson 02a draws. Then, on that page, in a 1920 x 1080 window:

- the math is rendered: MathML elements (website/hooks.py renders the TeX when the site is built) with a size,
  and no raw TeX (`$...$`, `\\(`, `\\frac`) in the text a reader sees;
- the title is whole: the document's title is the lesson's first heading, its inline code included;
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

            heading = page.locator("article h1").first.inner_text().rstrip("¶").strip()
            assert "`" not in heading and page.title().startswith(heading + " - "), (heading, page.title())
            code_in_heading = page.locator("article h1").first.locator("code").all_inner_texts()
            assert all(code in page.title() for code in code_in_heading), (code_in_heading, page.title())

            image = page.locator("article .jp-OutputArea-output img").first
            image.scroll_into_view_if_needed()
            natural, shown, column = image.evaluate("""i => [i.naturalWidth, i.getBoundingClientRect().width,
                i.closest('.jp-OutputArea-output').getBoundingClientRect().width]""")
            assert natural == PLOT_WIDTH, natural
            assert abs(shown - min(natural, column)) <= 1, f"a {natural}-px plot shown {shown:.0f} px in {column:.0f}"
            assert shown >= PLOT_WIDTH - 1, f"the content column ({column:.0f} px) is narrower than the plot at 1920 px"

            page.locator("article math").first.scroll_into_view_if_needed()
            page.screenshot(path=SHOTS / "site-page.png")
            away = sorted({u for u in requested if urlsplit(u).hostname not in ("127.0.0.1",)
                           and not u.startswith("data:")})
            assert not away, f"requests that leave localhost: {away}"
            assert any(u.endswith(".css") for u in requested), "the page's own stylesheets were requested"
        finally:
            chromium.close()
