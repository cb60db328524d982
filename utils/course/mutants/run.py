"""Each mutant of a lab through its checker, one fresh process each; the accepted ones through the oracle.

A mutant ends as one of: rejected with a named mistake (``LabCheckFailed.mistake``, any key but the generic
"crash"), rejected without a name (the generic "crash", another exception, the process's timeout or death), or
accepted; an accepted mutant is then *equivalent* (the oracle sees the expected results) or a *miss*.
score = rejected / (mutants - equivalent).
"""

import dataclasses
import json
import os
import random
import sys
import time
from pathlib import Path

from utils.checkers.labs import LABS
from utils.course.notebook_runner import ROOT, suite_world_sizes
from utils.launch.children import run_child

from .mutate import mutants

__all__ = ["LabScore", "choose", "run_lab"]

ORACLE_TIMEOUT = 600.0


@dataclasses.dataclass
class LabScore:
    lab: str
    mutants: int  # all the lab's mutants
    tried: int  # those run (a sample, or all)
    equivalent: int = 0
    named: int = 0
    unnamed: int = 0
    missed: int = 0
    seconds: float = 0.0
    records: list = dataclasses.field(default_factory=list)

    @property
    def score(self):
        judged = self.tried - self.equivalent
        return (self.named + self.unnamed) / judged if judged else 1.0

    @property
    def named_share(self):
        judged = self.tried - self.equivalent
        return self.named / judged if judged else 1.0


def choose(all_mutants, sample=None, limit=None, seed=0):
    """All mutants, or ``sample`` of them drawn with ``seed`` (kept in source order), then the first ``limit``."""
    chosen = list(all_mutants)
    if sample is not None and sample < len(chosen):
        chosen = sorted(random.Random(seed).sample(chosen, sample), key=lambda m: m.index)
    return chosen[:limit] if limit is not None else chosen


def _timeout(lab):
    """The subprocess's limit: every part's grading timeout at every suite size and the learner's, plus the
    start-up."""
    return 30.0 + (len(suite_world_sizes(lab.path(ROOT))) + 1) * sum(part.timeout for part in lab.parts)


def _trial(lab, path, result, timeout, oracle=False):
    """Run trial.py on one mutant: its JSON, or None and why."""
    result.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "utils.course.mutants.trial", lab.name, str(path), str(result)]
    child = run_child(command + (["--oracle"] if oracle else []), timeout, env=env, cwd=str(ROOT), limit=20_000)
    if result.exists():
        return json.loads(result.read_text()), None
    why = f"timed out after {timeout:g} s" if child.timed_out else f"exit code {child.code}: {child.tail(3)}"
    return None, why


def run_lab(name, sample=None, limit=None, seed=0, out=ROOT / "build" / "mutants", echo=print):
    """Every chosen mutant of lab ``name`` through its checker (and the oracle); writes out/<name>.json."""
    lab = LABS[name]
    source = (ROOT / "labs" / "solutions" / f"{lab.solution}.py").read_text()
    all_mutants = mutants(source, lab.answers)
    chosen = choose(all_mutants, sample, limit, seed)
    work = Path(out) / name
    work.mkdir(parents=True, exist_ok=True)
    score, start, timeout = LabScore(name, len(all_mutants), len(chosen)), time.monotonic(), _timeout(lab)
    for mutant in chosen:
        path, result = work / f"mutant_{mutant.index}.py", work / f"result_{mutant.index}.json"
        path.write_text(mutant.source)
        t0 = time.monotonic()
        verdict, why = _trial(lab, path, result, timeout)
        if verdict is None:
            verdict = dict(outcome="unnamed", mistake=None, detail=f"the process {why}")
        if verdict["outcome"] == "accepted":
            oracle, why = _trial(lab, path, result, ORACLE_TIMEOUT, oracle=True)
            if oracle is None:
                oracle = dict(equivalent=False, detail=f"the oracle's process {why}")
            verdict.update(outcome="equivalent" if oracle["equivalent"] else "missed", oracle=oracle["detail"])
        outcome = verdict["outcome"]
        setattr(score, outcome, getattr(score, outcome) + 1)
        score.records.append(dict(index=mutant.index, kind=mutant.kind, diff=mutant.diff,
                                  seconds=round(time.monotonic() - t0, 1), **verdict))
        echo(f"  {name} #{mutant.index:<3} {mutant.kind:<10} {outcome:<10} {verdict.get('mistake') or '':<18} "
             f"{time.monotonic() - t0:5.1f} s  {mutant.diff[:110]}")
        path.unlink()
        result.unlink(missing_ok=True)
    score.seconds = time.monotonic() - start
    if not any(work.iterdir()):
        work.rmdir()
    summary = {k: v for k, v in dataclasses.asdict(score).items() if k != "records"}
    report = dict(summary, score=score.score, named_share=score.named_share, sample=sample, limit=limit, seed=seed,
                  misses=[r for r in score.records if r["outcome"] == "missed"], records=score.records)
    (Path(out) / f"{name}.json").write_text(json.dumps(report, indent=1))
    return score
