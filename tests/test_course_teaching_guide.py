"""TEACHING.md is what utils/course/teaching_guide.py writes from the notebooks' stated minutes; its schedules
keep every rule of utils/course/schedules.py, and each notebook's prerequisites agree with its text."""

import json

import json
import re

import pytest

from utils.course import minutes, prerequisites, schedules, teaching_guide


def test_the_guide_is_current():
    assert teaching_guide.GUIDE.read_text() == teaching_guide.render(), "TEACHING.md is stale: run `make guide`"


def test_every_lab_checker_names_its_mistakes():
    for path in minutes.notebooks():
        if path.parent.name == "labs":
            assert teaching_guide.lab_mistakes(path.stem), f"{path.stem}: its checkers name no mistake"


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


@pytest.fixture(scope="module")
def course():
    """(minutes, prerequisites) of every notebook, stem -> value."""
    paths = minutes.notebooks()
    data = minutes.load_data()
    return ({p.stem: teaching_guide.row(p, data)["minutes"] for p in paths},
            {p.stem: prerequisites.declared(p) for p in paths})


def test_prerequisites_agree_with_each_notebooks_text():
    known = prerequisites.stems()
    assert [m for p in known.values() for m in prerequisites.disagreements(p, known)] == []


def test_prerequisites_that_disagree_with_the_text_are_caught(tmp_path):
    known = prerequisites.stems()
    nb = json.loads(known["09a_3d_mesh"].read_text())
    (tmp_path / "notebooks").mkdir()
    planted = tmp_path / "notebooks" / "09a_3d_mesh.ipynb"
    nb["metadata"]["course"]["prerequisites"].remove("05b_dtensor_and_sequence_parallelism")
    planted.write_text(json.dumps(nb))
    assert any("names 05b_dtensor_and_sequence_parallelism" in m for m in prerequisites.disagreements(planted, known))
    nb["metadata"]["course"]["prerequisites"] += ["05b_dtensor_and_sequence_parallelism", "07a_deepspeed_config"]
    planted.write_text(json.dumps(nb))
    assert [m for m in prerequisites.disagreements(planted, known) if "never names lesson 07" in m]


def test_each_plan_keeps_every_rule(course):
    minutes_of, needs = course
    for title, plan in schedules.PLANS.items():
        slots = schedules.lay_out(plan, minutes_of)
        assert schedules.problems(slots, minutes_of, needs) == [], title
        assert [s.stem for s in slots] == [s for day in plan for s in day], f"{title}: a notebook dropped or moved"
        for day in range(len(plan)):
            for block in range(len(schedules.BLOCKS)):
                used = sum(s.end - s.start for s in slots if (s.day, s.block) == (day, block))
                length = schedules.minute(schedules.BLOCKS[block][1]) - schedules.opening(day, block)
                assert used <= 0.85 * length, f"{title}, day {day + 1}: {used} of {length} min, under 15% slack"
    assert schedules.opening(0, 0) - schedules.minute(schedules.BLOCKS[0][0]) == schedules.SETUP > 0


def test_a_schedule_breaking_each_rule_fails(course):
    minutes_of, needs = course
    good = schedules.lay_out(schedules.PLANS["two days: collectives and data parallelism"], minutes_of)
    assert schedules.problems(good, minutes_of, needs) == []

    def broken(slots):
        return " ".join(schedules.problems(slots, minutes_of, needs))

    no_ring = [s for s in good if s.stem != "01b_ring_all_reduce"]  # 02a and lab 01a need it
    assert "02a_ddp_from_scratch at 09:00 needs 01b_ring_all_reduce" in broken(no_ring)
    swapped = [s._replace(day=1 - s.day) if s.stem.startswith("01b") else s for s in good]  # 01b on day 2
    assert "needs 01b_ring_all_reduce" in broken(swapped)
    late = [s._replace(start=s.start + 50, end=s.end + 50) if s.stem == "02a_ddp_from_scratch" else s for s in good]
    assert "runs outside its block" in broken(late)  # 02a across the 11:00 break
    early = [s._replace(start=s.start - 30, end=s.end - 30) if s.stem == "00_start_here" else s for s in good]
    assert "00_start_here 09:00-10:05 runs outside its block" in broken(early)  # into day 1's set-up
    a, b = [s for s in good if s.day == 1 and s.block in (0, 1)]  # 02a and 02b in one block: past its slack
    crowded = [s._replace(block=0, start=a.end, end=a.end + (s.end - s.start)) if s == b else s for s in good]
    assert "over its 102 (15% slack kept)" in broken(crowded)
    lab = [s._replace(day=1, block=3) if s.stem.endswith("halving_reduce_scatter_lab") else s for s in good]
    assert "01a_halving_reduce_scatter_lab at 16:00 is not after its own lesson 01a_point" in broken(lab)
    # lab 01a's own lesson is 01a: on another day it fails, even with 01b (also a prerequisite) beside the lab
    apart = [s._replace(day=1) if s.stem.startswith("01b_") or s.stem.endswith("halving_reduce_scatter_lab") else s
             for s in good]
    assert "01a_halving_reduce_scatter_lab at" in broken(apart) and "own lesson 01a_point" in broken(apart)
    twice = good + [good[0]._replace(day=1)]
    assert "00_start_here is scheduled 2 times" in broken(twice)
    on_top = [s._replace(block=0, start=a.start + 5, end=a.start + 5 + (s.end - s.start)) if s == b else s
              for s in good]  # 02b starting 5 minutes into 02a
    assert "02a_ddp_from_scratch 09:00-" in broken(on_top) and "overlaps 02b_ddp_in_practice 09:05" in broken(on_top)
    short = [s._replace(end=s.end - 5) if s.stem == "02_ddp_lab" else s for s in good]
    assert "02_ddp_lab is given 85 min, not its 90" in broken(short)  # its review dropped
    with pytest.raises(ValueError, match="fits in no block left"):
        schedules.lay_out([["03_zero_from_scratch"] * 5], minutes_of)


def test_the_guide_names_what_each_plan_leaves_out(course):
    minutes_of, needs = course
    text = teaching_guide.GUIDE.read_text()
    stems = [p.stem for p in minutes.notebooks()]
    for title, plan in schedules.PLANS.items():
        section = text.split(f"### {title[0].upper()}{title[1:]}")[1].split("###")[0]
        gone = schedules.left_out(plan, stems)
        assert gone and all(s in section for s in gone), title
        groups = sorted({s[:2] for s in gone})
        assert [line.split(",")[0] for line in section.splitlines() if line.startswith("- Lesson ")] == \
            [f"- Lesson {g}" for g in groups], title
        for day in range(len(plan)):  # breaks, lunch and the free minutes are rows of every day's table
            table = section.split(f"Day {day + 1} (")[1].split("\n\n")[1]
            assert table.count("| break |") == 2 and table.count("| lunch |") == 1 and "| free (" in table, title
    whole = sum(schedules.planned(s, minutes_of) for s in stems)
    assert whole > schedules.capacity(3) and f"is {len(stems)} notebooks and {whole} minutes" in text
    assert schedules.whole_course_days(stems, minutes_of, needs, whole) in text


def test_left_out_lines_say_what_can_be_homework(course):
    minutes_of, needs = course
    stems = [p.stem for p in minutes.notebooks()]
    lines = schedules.left_out_lines([schedules.DAY_1], stems, needs)
    ddp = next(line for line in lines if line.startswith("- Lesson 02,"))
    assert "Homework now (all they need was taught): 02a_ddp_from_scratch;" in ddp and "02_ddp_lab (needs 02a)" in ddp
    assert "only their practice is lost" in next(line for line in lines if line.startswith("- Lesson 01,"))
    lines = schedules.left_out_lines([schedules.DAY_1[:1]], stems, needs)  # only 00 taught
    assert "None can be homework yet" in next(line for line in lines if line.startswith("- Lesson 02,"))


def test_the_whole_course_is_packed_or_says_why_not(course):
    minutes_of, needs = course
    stems = [p.stem for p in minutes.notebooks()]
    few = {s: m for s, m in minutes_of.items()}
    for s in few:
        few[s] = 20  # every notebook short: the packer must lay the whole course out, keeping every rule
    plan = schedules.whole_course_plan(stems, few, needs)
    assert sorted(s for day in plan for s in day) == sorted(stems)
    assert schedules.problems(schedules.lay_out(plan, few), few, needs) == []
    with pytest.raises(ValueError, match="fit in no one day"):
        schedules.whole_course_plan(stems, dict.fromkeys(stems, 100), needs)


def test_a_lesson_named_only_by_number_must_be_declared(tmp_path):
    known = prerequisites.stems()
    nb = json.loads(known["04a_fsdp2_zero_redundancy"].read_text())
    nb["metadata"]["course"]["prerequisites"] = []
    (tmp_path / "notebooks").mkdir()
    planted = tmp_path / "notebooks" / "04a_fsdp2_zero_redundancy.ipynb"
    planted.write_text(json.dumps(nb))
    assert any("names lesson 03" in m for m in prerequisites.disagreements(planted, known))


def test_what_counts_as_a_lesson_named_and_as_a_sentence():
    own = "99_planted"
    assert prerequisites.named("2-6 ranks at a load of about 12, 30-40 minutes.", own) == (set(), set())
    assert prerequisites.named("lessons 03 (ZeRO's bytes) and 06, notebooks 01-02.", own)[1] == {"01", "02", "03", "06"}
    # the dot of .ipynb ends no sentence: the "helps" aside below drops lesson 05, never the linked 09a
    exact, numbers = prerequisites.named("[lesson 09](09a_3d_mesh.ipynb) (the model). Lesson 05 helps.", own)
    assert (exact, numbers) == ({"09a_3d_mesh"}, {"09"})
