"""TEACHING.md is what utils/course/teaching_guide.py writes from the notebooks' stated minutes, and its schedules
fit."""

import json
import re

import pytest

from utils.course import minutes, teaching_guide


def test_the_guide_is_current():
    assert teaching_guide.GUIDE.read_text() == teaching_guide.render(), "TEACHING.md is stale: run `make guide`"


def test_every_lesson_has_teaching_notes_and_every_lab_its_mistakes():
    for path in minutes.notebooks():
        if path.parent.name == "notebooks":
            assert path.stem in teaching_guide.NOTES, f"no teaching notes for {path.stem}"
        else:
            assert teaching_guide.lab_mistakes(path.stem), f"{path.stem}: its checkers name no mistake"
    assert set(teaching_guide.NOTES) <= {p.stem for p in minutes.notebooks()}, "notes for a notebook that is gone"


def test_each_schedule_fits_its_days():
    rows = {p.stem: teaching_guide.row(p, minutes.load_data()) for p in minutes.notebooks()}
    for days in teaching_guide.SCHEDULES.values():
        for day in days:
            slots, need, capacity = teaching_guide.lay_out(day, rows)
            assert need <= capacity and slots[0][1] == "09:00" and slots[-1][2] <= "17:00"
    with pytest.raises(ValueError, match="over the day's 360 min"):
        teaching_guide.lay_out(["03_zero_from_scratch"] * 5, rows)


def test_the_guide_states_each_notebooks_own_time():
    """Issue 40: the guide's minutes and parts are the ones the notebook's first cell states (one time per notebook),
    and the guide says which figures are measured and which computed."""
    text = teaching_guide.GUIDE.read_text()
    for path in minutes.notebooks():
        first = minutes.source(json.loads(path.read_text())["cells"][0])
        stated = re.search(re.escape(minutes.TIME_LINE) + r" about (\d+) minutes.*?(\d+|under a minute) reading, "
                           r"(\d+) on the code, (\d+|under a minute) running the cells, (\d+) on the", first)
        row = re.search(rf"\| \[{re.escape(minutes.key(path))}\]\([^)]*\) \| (\d+) \((\d+) / (\d+) / (\d+) / (\d+)",
                        text)
        assert stated and row, f"{minutes.key(path)}: no **Time** paragraph or no row in TEACHING.md"
        said = [int(x) if x.isdigit() else 0 for x in stated.groups()]
        assert said == [int(x) for x in row.groups()], f"{minutes.key(path)}: cell 1 says {said}, the guide {row.groups()}"
    assert "Every figure below is measured" not in text
    assert "Measured:" in text and "Computed from the notebook's text" in text
