"""TEACHING.md is what utils/course/teaching_guide.py writes from the notebooks' measured minutes, and its schedules
fit."""

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
