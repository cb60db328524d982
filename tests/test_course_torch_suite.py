"""utils/course/torch_suite.py (`make test-torch TORCH=X`): its report sorts what broke into notebooks, claim pointers
and other tests, and says when there is no claims checker. The environment and the suite themselves are what
`make test-torch` runs (long); here a JUnit file stands in for the suite."""

import json
from pathlib import Path

from utils.course import torch_suite

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="6">
<testcase classname="tests.test_notebooks" name="test_notebook_runs[notebooks/05a_tp.ipynb-ws2]" time="30">
  <failure message="AssertionError: speed-up 0.9 &lt; 1.2">long traceback</failure></testcase>
<testcase classname="tests.test_notebooks" name="test_notebook_runs[notebooks/00_start_here.ipynb-ws2]" time="9"/>
<testcase classname="tests.test_course_claims" name="test_every_pointer_resolves" time="1">
  <failure message="2 broken pointers">...</failure></testcase>
<testcase classname="tests.test_ddp_notebook" name="test_a_failing_fit_raises_in_the_caller" time="3">
  <error message="RuntimeError: Cannot re-initialize CUDA in forked subprocess">...</error></testcase>
<testcase classname="tests.test_gpu_paths" name="test_nccl" time="0"><skipped message="no GPU"/></testcase>
<testcase classname="tests.test_project" name="test_line_length" time="0"/>
</testsuite></testsuites>"""


def test_report_sorts_what_broke(tmp_path):
    (tmp_path / "junit.xml").write_text(JUNIT)
    junit = torch_suite.read_junit(tmp_path / "junit.xml")
    assert junit["counts"] == dict(passed=2, failed=2, errors=1, skipped=1)
    text = torch_suite.write_report(tmp_path, "2.15.0", "2.15.0+cu130 (CUDA 13.0 build) 0 GPU(s)", junit,
                                    ("no claims checker (utils/course/claims.py is not in this checkout)", []), 600.0,
                                    ("2.00, 1.50, 1.00", "3.00, 2.00, 1.50"), 1)
    assert text == (tmp_path / "report.md").read_text()
    notebooks, claims, others = text.split("## ")[1:]
    assert notebooks.startswith("Notebooks that broke (1)") and "05a_tp.ipynb-ws2" in notebooks
    assert "speed-up 0.9 < 1.2" in notebooks and "00_start_here" not in text
    assert "no claims checker" in claims and "test_every_pointer_resolves" in claims
    assert others.startswith("Other tests that broke (1)") and "Cannot re-initialize CUDA" in others
    assert "2 passed, 2 failed, 1 errors, 1 skipped (pytest exit 1) in 10.0 min" in text
    assert "at the start 2.00, 1.50, 1.00, at the end 3.00, 2.00, 1.50" in text


def test_broken_claims_in_the_usual_shapes():
    assert torch_suite._broken_items({"broken": [{"claim": "a"}]}) == [{"claim": "a"}]
    entries = [{"claim": "a", "ok": True}, {"claim": "b", "ok": False}, {"claim": "c", "status": "broken"}]
    assert [e["claim"] for e in torch_suite._broken_items(entries)] == ["b", "c"]
    assert [e["claim"] for e in torch_suite._broken_items({"pointers": entries})] == ["b", "c"]


def test_pins_but_torch_leave_torch_out():
    pins = torch_suite.pins_but_torch()
    assert pins and not any(p.lower().startswith("torch==") for p in pins) and any("lightning" in p for p in pins)
    assert json.dumps(pins)  # the stamp stores them


def test_options_then_pytest_arguments():
    """As the Makefile calls it: the options after the version, then ``--`` and PYTEST_ARGS (maybe none)."""
    args, rest = torch_suite.parse_args(["2.15.0", "--venv", "/envs/2.15.0", "--python", "python3", "--workers",
                                         "auto", "--", "-k", "ddp", "-x"])
    assert (args.torch, args.venv, args.python, args.workers, rest) == (
        "2.15.0", Path("/envs/2.15.0"), "python3", "auto", ["-k", "ddp", "-x"])
    args, rest = torch_suite.parse_args(["2.14.1", "--workers", "2", "--"])
    assert (args.torch, args.venv, args.workers, rest) == ("2.14.1", None, "2", [])
