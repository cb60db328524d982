"""The course as a learner meets it: `make lab`'s JupyterLab, driven in headless Chromium by Playwright.

`make browser-test` installs what this needs (Debian's chromium with apt, the `playwright` package of
pyproject's `browser` extra: Playwright drives the system's Chromium and never downloads a browser) and
runs it. Without them, `make test` skips it and says why.

It starts `make lab` itself (headless, a free port, a fresh token, autosave off, its settings and
workspaces in a temporary folder), then, as a learner would, with the menus, the mouse and the keyboard:

1. lesson 00: runs the cells above the first `%%ranks` cell, then that cell, and reads every rank's
   `[rank k]` line in the page;
2. lesson 03 (with `SMOKE = True` typed into its parameters cell, for time): runs up to the memory
   calculator, checks it shows the next cell's number (7.5 B, 1.88 GB) and labelled controls, picks
   another ZeRO stage and moves the parameter slider, and sees the numbers change;
3. lesson 06 (likewise): runs up to the schedule explorer, checks its labels are whole and its picture
   is not stretched, moves the micro-batch slider and sees the picture change;
4. lab 01a, a learner's journey: types a wrong answer that falls into the lab's first trap, runs the check and
   sees the feedback panel name that trap (`halved_elements`), its evidence and hint, and no checker frame;
   types a right answer and sees the check pass and say what it checked. Both answers are made at test time
   from the reference solution in labs/solutions/, so no file a learner opens holds the lab's answer.

Screenshots go to build/browser/. The notebooks on disk are checked unchanged afterwards.
"""

import inspect
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "build" / "browser"
CHROMIUM = os.environ.get("CHROMIUM", shutil.which("chromium") or "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
playwright_api = pytest.importorskip("playwright.sync_api", reason="needs the playwright package: `make browser-test`")
if not Path(CHROMIUM).is_file():
    pytest.skip(f"needs Debian's chromium at {CHROMIUM} (`make browser-test` installs it; CHROMIUM=path to "
                "use another)", allow_module_level=True)
pytestmark = pytest.mark.browser
RUN_TIMEOUT_S = 600  # a whole lesson's cells above a widget, with SMOKE = True, on a loaded 2-core machine
CHECK_TIMEOUT_S = 240  # lab 01a's cells up to its check, and the check on 2 and 4 ranks: ~30 s on 2 cores


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """`make lab` with no browser of its own on a free port; yields its base URL and token."""
    port, token = free_port(), secrets.token_hex(16)
    settings = tmp_path_factory.mktemp("lab-settings")
    docmanager = settings / "@jupyterlab" / "docmanager-extension"
    docmanager.mkdir(parents=True)
    (docmanager / "plugin.jupyterlab-settings").write_text(json.dumps({"autosave": False}))
    # no "Jupyter news?" toast over the page: the course's own overrides (utils/course/lab_overrides.json) see to it
    env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(settings),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path_factory.mktemp("lab-workspaces")))
    notebooks = {p: p.read_bytes() for p in ROOT.glob("*/*.ipynb")}
    log = (tmp_path_factory.mktemp("lab-log") / "lab.log").open("w+")
    args = f"--no-browser --port={port} --ServerApp.port_retries=0 --IdentityProvider.token={token}"
    server = subprocess.Popen(["make", "--no-print-directory", "lab", f"LAB_ARGS={args}"], cwd=ROOT, env=env,
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=5)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    pytest.fail(f"`make lab` did not serve {url} within 120 s:\n{log.read()[-3000:]}")
                time.sleep(1)
        yield url, token
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # make, jupyter lab and its kernels: the group we started
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        changed = [p.name for p, data in notebooks.items() if p.read_bytes() != data]
        for p in changed:
            p.write_bytes(notebooks[p])
        assert not changed, f"the browser test changed notebooks on disk (restored): {changed}"


@pytest.fixture(scope="module")
def browser():
    SHOTS.mkdir(parents=True, exist_ok=True)
    with playwright_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield chromium
        chromium.close()


def open_notebook(browser, lab, path):
    url, token = lab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{url}/lab/tree/{path}?token={token}&reset")
    try:
        page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=120_000)
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
    except playwright_api.Error:
        page.screenshot(path=SHOTS / f"failed_{Path(path).stem}.png")
        raise
    return page


def cell_with(page, text):
    """The first code cell whose text contains ``text``."""
    return page.locator(".jp-NotebookPanel .jp-CodeCell").filter(has_text=text).first


def wait_idle(page, timeout_s=RUN_TIMEOUT_S):
    """Until no cell shows [*] and the kernel is idle; then raise if a cell showed an error."""
    panel = ".jp-NotebookPanel"
    page.wait_for_function(f"""() => ![...document.querySelectorAll('{panel} .jp-InputPrompt')]
                                     .some(p => p.textContent.includes('*'))""", timeout=timeout_s * 1000)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=timeout_s * 1000)
    errors = page.locator(f"{panel} [data-mime-type='application/vnd.jupyter.stderr']").filter(
        has_text=re.compile("Traceback|Error:"))
    if errors.count():
        raise AssertionError("a cell failed in the browser:\n" + errors.first.inner_text()[-3000:])


def run_up_to(page, cell, smoke=False):
    """Run every cell from the first to ``cell``, with Shift+Enter (run and go to the next), as a learner would."""
    cells = page.locator(".jp-NotebookPanel .jp-Cell")
    if smoke:  # a line typed at the end of the parameters cell, as a learner in a hurry would
        params = cells.filter(has_text="SMOKE = False").first
        params.locator(".cm-content").click()
        page.keyboard.press("Control+End")
        page.keyboard.type("\nSMOKE = True  # the browser test: small sizes")
        page.keyboard.press("Escape")
    target = cell.evaluate("c => [...document.querySelectorAll('.jp-NotebookPanel .jp-Cell')].indexOf(c)")
    cells.first.locator(".jp-InputPrompt").click()
    for _ in range(target + 1):
        page.keyboard.press("Shift+Enter")
    wait_idle(page)


def test_lesson_00_ranks_cell_prints_every_rank(browser, lab):
    page = open_notebook(browser, lab, "notebooks/00_start_here.ipynb")
    cell = cell_with(page, "%%ranks")
    # text_content, not inner_text: innerText depends on layout, and JupyterLab skips rendering the cells out of
    # view (content-visibility); once, with this test run first, it came back without "WORLD_SIZE = 4"
    world_size = int(re.search(r"WORLD_SIZE = (\d+)", cell_with(page, "WORLD_SIZE =").text_content()).group(1))
    run_up_to(page, cell)
    out = cell.locator(".jp-OutputArea")
    out.scroll_into_view_if_needed()
    text = out.inner_text()
    page.screenshot(path=SHOTS / "00_ranks_cell.png")
    cell.screenshot(path=SHOTS / "00_ranks_cell_only.png")
    assert "[launch]" in text, text
    # JupyterLab wraps output lines anywhere (word-break: break-all), so the launcher keeps its lines short
    long = [line for line in text.splitlines() if line.startswith("[launch]") and len(line) > 100]
    assert not long, f"[launch] lines over 100 characters wrap mid-word in JupyterLab: {long}"
    for rank in range(world_size):
        assert f"[rank {rank}] rank {rank}: total = {world_size * (world_size - 1) / 2}" in text, text
    page.close()


def test_lesson_03_memory_calculator_reacts(browser, lab):
    page = open_notebook(browser, lab, "notebooks/03_zero_from_scratch.ipynb")
    cell = cell_with(page, "ZeroCalculator(zero_text")
    run_up_to(page, cell, smoke=True)
    widget = cell.locator(".widget-vbox").first
    widget.scroll_into_view_if_needed()
    result = widget.locator("pre")
    result.wait_for(timeout=60_000)
    before = result.inner_text()
    widget.screenshot(path=SHOTS / "03_calculator_default.png")
    assert before.startswith("7.5 B parameters, 64 ranks, ZeRO stage 3") and "total 1.88 GB" in before, before
    labels = widget.locator(".widget-label").all_inner_texts()
    for label in ("params (B)", "world size", "ZeRO stage", "precision", "optimizer"):
        assert label in labels, f"no label {label!r} in {labels}"
    track = widget.locator(".widget-slider").nth(1).bounding_box()  # the world-size slider
    assert track["width"] > 300, f"the world-size slider is {track['width']:.0f} px wide for 1-1024"
    widget.locator("select").first.select_option(label="0: plain DP")
    page.wait_for_function("t => !document.body.innerText.includes(t)", arg=before.splitlines()[0])
    after_stage = result.inner_text()
    assert "ZeRO stage 0" in after_stage and "total 120.00 GB" in after_stage, after_stage  # 16 x 7.5e9
    widget.locator(".noUi-handle").first.focus()
    page.keyboard.press("ArrowRight")  # the next model size: 8 B
    page.wait_for_function("() => document.body.innerText.includes('8 B parameters')")
    after = result.inner_text()
    widget.screenshot(path=SHOTS / "03_calculator_moved.png")
    assert "total 128.00 GB" in after, after
    page.close()


def test_lesson_06_schedule_explorer_reacts(browser, lab):
    page = open_notebook(browser, lab, "notebooks/06b_pipeline_bubble.ipynb")
    cell = cell_with(page, "ScheduleExplorer(schedule_figure")
    run_up_to(page, cell, smoke=True)
    widget = cell.locator(".widget-vbox").first
    image = widget.locator("img")
    image.wait_for(timeout=60_000)
    widget.scroll_into_view_if_needed()
    widget.screenshot(path=SHOTS / "06_explorer_default.png")
    label = widget.locator(".widget-label", has_text="micro-batches m")
    assert label.evaluate("e => e.scrollWidth <= e.clientWidth"), "the label 'micro-batches m' is cut"
    natural, shown = image.evaluate("i => [i.naturalWidth, i.getBoundingClientRect().width]")
    assert abs(shown - natural / 2) <= 1, f"picture of {natural} px shown {shown:.0f} px wide: stretched"
    before = image.get_attribute("src")
    widget.locator(".widget-slider", has_text="micro-batches m").locator(".noUi-handle").focus()
    for _ in range(6):
        page.keyboard.press("ArrowLeft")  # m = 8 -> 2: a bigger bubble
    page.wait_for_function("([e, s]) => e.getAttribute('src') !== s", arg=[image.element_handle(), before])
    page.wait_for_timeout(500)
    widget.screenshot(path=SHOTS / "06_explorer_moved.png")
    page.screenshot(path=SHOTS / "06_explorer_page.png")
    page.close()


def type_into(page, cell, text):
    """Replace the code of ``cell`` with ``text``, as a paste: no auto-indent or closing brackets added."""
    cell.locator(".cm-content").click()
    page.keyboard.press("Control+A")
    page.keyboard.insert_text(text)
    page.keyboard.press("Escape")


def run_from(page, first, last):
    """Run the cells from index ``first`` to ``last`` with Shift+Enter, as a learner would; don't wait."""
    page.locator(".jp-NotebookPanel .jp-Cell").nth(first).locator(".jp-InputPrompt").click()
    for _ in range(last - first + 1):
        page.keyboard.press("Shift+Enter")


def lab01a_answers():
    """(wrong, right) sources of lab 01a's ``halving_reduce_scatter``, made from the reference solution now.

    The wrong one takes chunk offsets k * numel // p instead of ``chunk_bounds``: on 2 and 4 ranks that cuts
    exactly where halving the elements does, the lab's first trap (the checker's hint for it says so)."""
    sys.path.insert(0, str(ROOT / "labs"))
    try:
        from solutions import halving_doubling
    finally:
        sys.path.remove(str(ROOT / "labs"))
    right = "from utils.comm.p2p import sendrecv\n\n\n" + inspect.getsource(halving_doubling.halving_reduce_scatter)
    wrong = right
    for line, trap in (("bounds = chunk_bounds(flat.numel(), p)",
                        "bounds = [k * flat.numel() // p for k in range(p + 1)]"),
                       ("scratch = torch.empty_like(flat[: bounds[p // 2]])", "scratch = torch.empty_like(flat)")):
        assert line in wrong, f"the reference no longer has {line!r}: update the planted trap"
        wrong = wrong.replace(line, trap)  # its own offsets, and a buffer large enough for any half
    return wrong, right


def test_lab_01a_check_names_the_first_trap_then_passes(browser, lab):
    wrong, right = lab01a_answers()
    page = open_notebook(browser, lab, "labs/01a_halving_reduce_scatter_lab.ipynb")
    index = "c => [...document.querySelectorAll('.jp-NotebookPanel .jp-Cell')].indexOf(c)"
    at = {name: cell_with(page, text).evaluate(index) for name, text in
          (("answer", "## YOUR CODE"), ("check", "check_halving_reduce_scatter("))}
    # by position from now on: JupyterLab may not keep the text of a cell out of view in the page
    answer, check = (page.locator(".jp-NotebookPanel .jp-Cell").nth(at[name]) for name in ("answer", "check"))
    type_into(page, answer, wrong)
    run_from(page, 0, at["check"])  # every cell, the check last
    # the panel, not any other stderr output of the cell (a warning): a locator that matches two is an error
    panel = check.locator("[data-mime-type='application/vnd.jupyter.stderr']").filter(has_text="Not yet")
    try:
        panel.wait_for(timeout=CHECK_TIMEOUT_S * 1000)
    except playwright_api.Error:
        page.screenshot(path=SHOTS / "failed_lab01a.png")
        raise
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=RUN_TIMEOUT_S * 1000)
    check.scroll_into_view_if_needed()
    check.screenshot(path=SHOTS / "lab01a-panel.png")
    text = panel.inner_text()
    flat = " ".join(text.split())
    assert "Not yet: halved_elements" in text and "the lab's first trap" in flat, text
    assert "world_size=4 · rank" in flat and "try next" in text, text
    assert "Traceback" not in text and "utils/checkers" not in text and "skipping hidden" not in text, text
    assert "PASSED" not in check.inner_text(), "the check cell failed, yet its output says PASSED"

    type_into(page, answer, right)
    run_from(page, at["answer"], at["check"])
    wait_idle(page)
    out = check.locator(".jp-OutputArea")
    check.scroll_into_view_if_needed()
    check.screenshot(path=SHOTS / "lab01a-pass.png")
    text = out.inner_text()
    assert "PASSED: halving_reduce_scatter" in text and "world_size=4: every case's chunk v on rank v" in text, text
    assert "Not yet" not in text, text
    page.close()
