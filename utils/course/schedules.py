"""Workshop schedules a day can hold: each plan's lessons and labs packed into fixed blocks between breaks, with
set-up time on day 1, slack in every block, no notebook split by a break, every notebook after its prerequisites
(utils/course/prerequisites.py) and every lab on the day of its own lesson and after it (the lesson of its number), followed by minutes to go over it.
TEACHING.md's schedules are written from here (utils/course/teaching_guide.py); tests/test_course_teaching_guide.py
checks every plan with ``problems`` and plants a schedule that breaks each rule.

The packing is deliberately plain: a plan says which notebooks each day holds, in order; each goes into the
day's first block that still has room for all of it, never split, never reordered.
"""

import math
from collections import Counter, namedtuple
from itertools import combinations

# A teaching day, 09:00-17:30: four blocks; between them a 15-minute break, lunch (12:45-13:45), a 15-minute break.
# The long blocks hold what a short one cannot: a 90-minute lesson, or a lab with its review.
BLOCKS = [("09:00", "11:00"), ("11:15", "12:45"), ("13:45", "15:45"), ("16:00", "17:30")]
SETUP = 30     # minutes at the start of day 1: logins, introductions, `make preflight` on the room's machine
SLACK = 0.15   # of every block left unplanned: questions, a slow machine, the instructor's own talk
REVIEW = 10    # minutes after each lab to go over it together (its checker's usual mistakes: the guide lists them)

# Each plan: the notebooks of each day, in order. A lab follows its lesson on the same day.
DAY_1 = ["00_start_here", "01a_point_to_point_and_collectives", "01b_ring_all_reduce", "01a_halving_reduce_scatter_lab"]
DDP = ["02a_ddp_from_scratch", "02b_ddp_in_practice", "02_ddp_lab", "11b_hangs_and_profiles"]
PLANS = {
    "one day: collectives from scratch": [DAY_1],
    "two days: collectives and data parallelism": [DAY_1, DDP],
    "three days: collectives, data parallelism and ZeRO": [
        DAY_1, DDP,
        ["03_zero_from_scratch", "04a_fsdp2_zero_redundancy", "03_zero_lab", "04b_dtensor_meta_checkpoints"]],
}


Slot = namedtuple("Slot", "stem day block start end")  # start and end in minutes after midnight


def minute(hhmm):
    h, m = map(int, hhmm.split(":"))
    return 60 * h + m


def clock(minutes):
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def is_lab(stem):
    return stem.endswith("_lab")


def number(stem):
    """A notebook's lesson number: ``01a`` of 01a_halving_reduce_scatter_lab, ``02`` of 02_ddp_lab."""
    return stem.split("_")[0]


def own_lessons(lab, needs):
    """The lessons a lab practises: those of its prerequisites with its number (lab 01a -> lesson 01a; lab 02 ->
    lesson 02a), else with its number's two digits (lab 11a practises 11b, which it declares)."""
    return ([p for p in needs if number(p) == number(lab)] or
            [p for p in needs if number(p)[:2] == number(lab)[:2]])


def planned(stem, minutes_of):
    """A notebook's minutes in a schedule: its measured minutes, and REVIEW more for a lab."""
    return minutes_of[stem] + (REVIEW if is_lab(stem) else 0)


def opening(day, block):
    """The first minute of a block that can be planned: after the set-up on day 1's first block."""
    return minute(BLOCKS[block][0]) + (SETUP if (day, block) == (0, 0) else 0)


def room(day, block):
    """Minutes a block may plan: what is left after set-up, less its slack (rounded down)."""
    return math.floor((minute(BLOCKS[block][1]) - opening(day, block)) * (1 - SLACK))


def lay_out(plan, minutes_of):
    """The plan's slots, day by day; raises ValueError naming the notebook that a day cannot hold."""
    slots = []
    for day, stems in enumerate(plan):
        block, used = 0, 0
        for stem in stems:
            need = planned(stem, minutes_of)
            while block < len(BLOCKS) and used + need > room(day, block):
                block, used = block + 1, 0
            if block == len(BLOCKS):
                rooms = ", ".join(str(room(day, b)) for b in range(len(BLOCKS)))
                raise ValueError(f"day {day + 1}: {stem} ({need} min) fits in no block left (blocks plan at most "
                                 f"{rooms} min with {SLACK:.0%} slack); move it to another day or drop it")
            start = opening(day, block) + used
            slots.append(Slot(stem, day, block, start, start + need))
            used += need
    return slots


def problems(slots, minutes_of, prerequisites):
    """Every rule a schedule breaks, one sentence each ([] for a good one). ``prerequisites``: stem -> stems."""
    out = []
    for s in slots:
        if s.end - s.start != planned(s.stem, minutes_of):
            out.append(f"{s.stem} is given {s.end - s.start} min, not its {planned(s.stem, minutes_of)}")
        if not opening(s.day, s.block) <= s.start < s.end <= minute(BLOCKS[s.block][1]):
            out.append(f"day {s.day + 1}: {s.stem} {clock(s.start)}-{clock(s.end)} runs outside its block "
                       f"{'-'.join(BLOCKS[s.block])} (across a break, or into the set-up)")
        before = [t for t in slots if (t.day, t.end) <= (s.day, s.start)]
        for p in prerequisites[s.stem]:
            if p not in {t.stem for t in before}:
                out.append(f"day {s.day + 1}: {s.stem} at {clock(s.start)} needs {p}, which is not scheduled before it")
        if is_lab(s.stem):
            mine = own_lessons(s.stem, prerequisites[s.stem])
            if not mine:
                out.append(f"{s.stem}: none of its prerequisites {prerequisites[s.stem]} is a lesson of its number "
                           f"{number(s.stem)}; declare that lesson")
            for lesson in mine:
                at = [t for t in slots if t.stem == lesson]
                if at and not (at[0].day == s.day and at[0].end <= s.start):
                    out.append(f"day {s.day + 1}: {s.stem} at {clock(s.start)} is not after its own lesson {lesson} on "
                               f"the same day (that is on day {at[0].day + 1} at {clock(at[0].start)})")
    for stem, n in Counter(s.stem for s in slots).items():
        if n > 1:
            out.append(f"{stem} is scheduled {n} times; keep it once")
    for a, b in combinations(slots, 2):
        if a.day == b.day and a.start < b.end and b.start < a.end:
            out.append(f"day {a.day + 1}: {a.stem} {clock(a.start)}-{clock(a.end)} overlaps {b.stem} "
                       f"{clock(b.start)}-{clock(b.end)}")
    blocks = {(s.day, s.block) for s in slots}
    for day, block in sorted(blocks):
        used = sum(s.end - s.start for s in slots if (s.day, s.block) == (day, block))
        if used > room(day, block):
            out.append(f"day {day + 1}, block {'-'.join(BLOCKS[block])}: {used} min planned, over its "
                       f"{room(day, block)} ({SLACK:.0%} slack kept)")
    return out


def left_out(plan, stems):
    """The notebooks (of ``stems``, in course order) that a plan does not schedule."""
    kept = {s for day in plan for s in day}
    return [s for s in stems if s not in kept]


def capacity(days):
    """Minutes that ``days`` days can plan at these rules (set-up and slack taken off)."""
    return sum(room(d, b) for d in range(days) for b in range(len(BLOCKS)))


def days_for(total):
    """The fewest days whose planned minutes reach ``total`` (a lower bound: packing may need more)."""
    days = 1
    while capacity(days) < total:
        days += 1
    return days


# What a learner can do after each lesson group (a number's lessons and labs), said where a plan leaves a group out.
SKILLS = {
    "00": "start ranks and run code on them (`run_ranks`, `%%ranks`)",
    "01": "send, receive and run collectives, and count a ring all-reduce's bytes",
    "02": "build, measure and use data parallelism (DDP)",
    "03": "say where training memory goes and shard it away (ZeRO)",
    "04": "shard with PyTorch's own tools: FSDP2, DTensor, the meta device, sharded checkpoints",
    "05": "split layers across ranks: tensor and sequence parallelism",
    "06": "run pipeline schedules and measure their bubble",
    "07": "configure and run DeepSpeed and its ZeRO stages",
    "08": "train under Lightning's strategies and speed-ups, and judge FP8 numerics",
    "09": "combine FSDP, tensor and pipeline parallelism on one mesh, cost it and plan it",
    "10": "launch on more than one machine with torchrun and Slurm",
    "11": "resume after a failure, find a hang, read a profile",
    "12": "treat parallelism as a graph transformation with torch.fx",
    "13": "run data parallelism in TensorFlow and Horovod",
    "14": "split attention over a sequence across ranks (context parallelism)",
    "15": "route tokens to experts over all-to-all (expert parallelism)",
}


def whole_course_plan(stems, minutes_of, prerequisites):
    """The whole course packed by this scheduler: notebooks in course order, each lab right after the last of its
    prerequisites; a lab and everything from its own lesson to it form one unit that no day boundary splits; a day
    takes units until the next fits no block. Raises ValueError naming a unit that fits in no one day."""
    order = [s for s in stems if not is_lab(s)]
    for lab in (s for s in stems if is_lab(s)):
        at = max(order.index(p) for p in prerequisites[lab]) + 1
        while at < len(order) and is_lab(order[at]):  # after the labs already there
            at += 1
        order.insert(at, lab)
    start = list(range(len(order)))  # start[i]: where the unit holding order[i] begins
    for i, stem in enumerate(order):
        if is_lab(stem):
            first = min(order.index(p) for p in own_lessons(stem, prerequisites[stem]))
            for j in range(first, i + 1):
                start[j] = min(start[j], start[first])
    units = [[order[i] for i in range(len(order)) if start[i] == u] for u in sorted(set(start))]
    plan = [[]]
    for unit in units:
        try:
            lay_out(plan[:-1] + [plan[-1] + unit], minutes_of)
            plan[-1] += unit
        except ValueError:
            plan.append(list(unit))
            try:
                lay_out(plan, minutes_of)
            except ValueError as e:
                raise ValueError(f"{', '.join(unit)} (a lab, its own lesson and what comes between) fit in no one "
                                 f"day in this order: {e}") from None
    if broken := problems(lay_out(plan, minutes_of), minutes_of, prerequisites):
        raise ValueError("the whole course packed breaks the rules: " + "; ".join(broken))
    return plan


def whole_course_days(stems, minutes_of, prerequisites, whole):
    """A sentence on how many days the whole course takes: packed by ``whole_course_plan``, or why it cannot be."""
    bound = (f"its minutes alone need at least {days_for(whole)} days (day 1 plans {capacity(1)} minutes, each later "
             f"day {capacity(2) - capacity(1)})")
    try:
        return f"packed by this scheduler it takes {len(whole_course_plan(stems, minutes_of, prerequisites))} days; {bound}."
    except ValueError as e:
        return f"{bound}, and this scheduler cannot pack it at all in course order: {e}."


def left_out_lines(plan, stems, prerequisites):
    """One line per left-out group: the skill lost, and which of its notebooks can be homework now (their
    prerequisites were all taught) and which need more first."""
    kept = {s for day in plan for s in day}
    gone = left_out(plan, stems)
    lines = []
    for group in sorted({number(s)[:2] for s in gone}):
        mine = [s for s in gone if number(s)[:2] == group]
        lost = (f"a learner cannot yet {SKILLS[group]}" if any(not is_lab(s) for s in mine) else
                f"its lessons were taught, so only their practice is lost (to {SKILLS[group]})")
        ready = [s for s in mine if set(prerequisites[s]) <= kept]
        later = {s: sorted(number(p) for p in set(prerequisites[s]) - kept) for s in mine if s not in ready}
        said = f"Homework now (all they need was taught): {', '.join(ready)}" if ready else "None can be homework yet"
        if later:
            said += "; after more lessons: " + ", ".join(f"{s} (needs {', '.join(n)})" for s, n in later.items())
        lines.append(f"- Lesson {group}, {len(mine)} left out: {lost}. {said}.")
    return lines


def rows(day, slots, minutes_of):
    """A day's table rows: set-up, every notebook, the unplanned (free) minutes of each block, breaks and lunch."""
    out = [f"| {clock(minute(BLOCKS[0][0]))} | {clock(opening(0, 0))} | set-up | {SETUP} |"] if day == 0 else []
    for block, (_, end) in enumerate(BLOCKS):
        at = opening(day, block)
        for s in (s for s in slots if (s.day, s.block) == (day, block)):
            out.append(f"| {clock(s.start)} | {clock(s.end)} | {s.stem} | {minutes_of[s.stem]}"
                       f"{f' + {REVIEW} to go over it' if is_lab(s.stem) else ''} |")
            at = s.end
        if minute(end) > at:
            out.append(f"| {clock(at)} | {end} | free (questions, slack) | {minute(end) - at} |")
        if block + 1 < len(BLOCKS):
            gap = minute(BLOCKS[block + 1][0]) - minute(end)
            out.append(f"| {end} | {BLOCKS[block + 1][0]} | {'lunch' if gap >= 60 else 'break'} | {gap} |")
    return out


def markdown(minutes_of, prerequisites, titles, day_end=None):
    """TEACHING.md's schedules section (a list of lines). ``titles``: stem -> the notebook's title; ``day_end``:
    the day's notebooks -> lines to print after its table (the day check), or None."""
    stems = list(titles)
    whole = sum(planned(s, minutes_of) for s in stems)
    lines = ["## Schedules", "",
             "A day runs 09:00-17:30 in four blocks, " + ", ".join("-".join(b) for b in BLOCKS) +
             " (15-minute breaks, an hour for lunch). Day 1 starts with "
             f"{SETUP} minutes of set-up (logins, introductions, `make preflight`). Every block keeps {SLACK:.0%} of "
             "its time unplanned for questions and the instructor's own talk; no notebook runs across a break; every "
             "notebook comes after the lessons it needs (its **You need**, kept in `metadata.course.prerequisites`); "
             f"each lab comes after its own lesson (the one of its number) on the same day, with {REVIEW} minutes after it to go over it together "
             "(`make grade` grades the room's submissions first). Times are the notebooks' stated minutes (their first cell's **Time**), "
             "exercises included.", "",
             f"The whole course is {len(stems)} notebooks and {whole} minutes (labs' reviews included); three days "
             f"at these rules plan {capacity(3)} minutes, so it "
             + ("fits in three days." if whole <= capacity(3) else
                f"does not fit: {whole_course_days(stems, minutes_of, prerequisites, whole)} Each plan below names "
                "what it leaves out."), ""]
    for title, plan in PLANS.items():
        slots = lay_out(plan, minutes_of)
        if broken := problems(slots, minutes_of, prerequisites):
            raise ValueError(f"the plan '{title}' breaks the rules: " + "; ".join(broken))
        lines += [f"### {title[0].upper()}{title[1:]}", ""]
        for day in range(len(plan)):
            mine = [s for s in slots if s.day == day]
            lines += [f"Day {day + 1} ({sum(s.end - s.start for s in mine)} minutes planned of "
                      f"{capacity(day + 1) - capacity(day)} the day can hold):", "",
                      "| from | to | notebook | minutes |", "| --- | --- | --- | --- |"]
            lines += rows(day, slots, minutes_of)
            lines.append("")
            if day_end:
                lines += day_end(plan[day])
        gone = left_out(plan, stems)
        lines += [f"Left out ({len(gone)} notebooks, {sum(minutes_of[s] for s in gone)} minutes), by lesson:", ""]
        lines += left_out_lines(plan, stems, prerequisites)
        lines.append("")
    return lines
