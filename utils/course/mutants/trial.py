"""One mutant, in a process of its own: the lab's checker on it, or the equivalence oracle.

    python -m utils.course.mutants.trial LAB MUTANT.py RESULT.json [--oracle]

The mutant's module text is executed as a module that cannot be imported (``__name__`` ``mutant_<solution>``), as
``answers_from_notebook`` does with a learner's notebook, so cloudpickle ships its functions to the ranks by value.
Writes RESULT.json: ``{"outcome": "accepted" | "named" | "unnamed", "mistake": key or None, "part": ..., "detail":
...}``; with ``--oracle``, ``{"equivalent": bool, "detail": the first difference}``.
"""

import json
import sys
from pathlib import Path

from utils.checkers.common import LabCheckFailed
from utils.checkers.labs import LABS
from utils.course.notebook_runner import ROOT, suite_world_sizes

UNNAMED = ("crash",)  # LabCheckFailed keys that name no mistake: the generic "your code raised"


def answers_of(source, lab, module_name):
    """The lab's names from a solution module's text (``diagnosis_X`` from its DIAGNOSES table)."""
    namespace = {"__name__": module_name}
    exec(compile(source, f"<{module_name}>", "exec"), namespace)
    answers = {name: namespace[name] for name in lab.answers if name in namespace}
    for name in lab.answers:
        if name.startswith("diagnosis_"):
            answers[name] = namespace["DIAGNOSES"][name.removeprefix("diagnosis_")]
    return answers


def judge(lab, answers):
    """The lab's parts at the suite's world sizes, as tests/test_every_lab.py runs the reference, then (a mutant
    they accept) as the learner's own check runs them: the notebook's WORLD_SIZE, without SMOKE (6 ranks
    included). The first rejection (``sizes``: "suite" or "learner"), or accepted."""
    from utils.workshop.grade import lab_world_size

    runs = [(n, True, "suite") for n in suite_world_sizes(lab.path(ROOT))]
    runs.append((lab_world_size(lab.name), False, "learner"))
    for n, smoke, sizes in runs:
        for part in lab.parts:
            try:
                result = part.run(answers, world_size=n, smoke=smoke)
            except LabCheckFailed as err:
                outcome = "unnamed" if err.mistake in UNNAMED else "named"
                return dict(outcome=outcome, mistake=err.mistake, part=part.name, world_size=n, sizes=sizes,
                            detail=str(err).splitlines()[0][:300])
            except Exception as err:  # anything else the checker let through is a rejection without a name
                return dict(outcome="unnamed", mistake=None, part=part.name, world_size=n, sizes=sizes,
                            detail=f"{type(err).__name__}: {str(err)[:300]}")
            if not str(result).startswith("PASSED"):
                return dict(outcome="unnamed", mistake=None, part=part.name, world_size=n, sizes=sizes,
                            detail=str(result)[:300])
    return dict(outcome="accepted", mistake=None, part=None, world_size=None, detail=None)


def main(argv):
    name, mutant, out = argv[:3]
    lab = LABS[name]
    answers = answers_of(Path(mutant).read_text(), lab, f"mutant_{lab.solution}")
    if "--oracle" in argv:
        from .oracle import differences
        solution = (ROOT / "labs" / "solutions" / f"{lab.solution}.py").read_text()
        found = differences(lab, answers, answers_of(solution, lab, f"reference_{lab.solution}"))
        result = dict(equivalent=found is None, detail=found)
    else:
        result = judge(lab, answers)
    Path(out).write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
