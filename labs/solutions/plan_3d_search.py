"""The teacher's side of lab 09's checker (utils/checkers/plan_3d.py): its own search of the lab's space, and the
diagnosis that names the knob a slower plan's search skipped. Not an answer to copy, and not for learners: it lives
here, in ``labs/solutions/``, which the student release leaves out and the grader's sandbox hides.

The shipped checker judges by results: ``OPTIMA``, a table of each job's optimum written as numbers (its step time,
its memory per rank, its knobs, and, where it fills the cap to the byte, the fastest time strictly under the cap).
This module is where that table comes from (``optima``; tests/checkers/test_plan_3d.py recomputes it and fails on
any difference) and, where the checker can import it (the teacher's checkout: ``make grade``'s judge, the tests,
the lab run by its teacher), what names the knob a slower plan's search never varied (``blame``).

    python -m labs.solutions.plan_3d_search   # prints OPTIMA, to paste into utils/checkers/plan_3d.py

It enumerates the space itself, not with ``utils.planner.best_plans`` nor the reference's ``choose_plan``: a judge
must not share the search it judges.
"""

import itertools
import json

from utils import planner
from utils.checkers.plan_3d import JOBS, KNOBS, SPACE, plan_knobs

# Jobs the release does not ship (nor their optima): the teacher's checkout judges choose_plan on these too, so an
# answer that looks its plans up in the release's OPTIMA, and falls back to a search of its own for any other job,
# is judged on that search. Each is a twin of a job of CASES at another global batch (or cap), whose optimum needs the same
# knobs (the same ZeRO stage, checkpointing, v, micro-batch, a pipeline and tp or not: tests/checkers/test_plan_3d.py
# checks it), so each mistake CASES catches, a twin catches too; the twin of the cap filled to the byte fills its own.
def _hidden_jobs():
    from utils.checkers.plan_3d import CASES

    jobs = []
    for name, model, cluster, n_gpus, batch, precision, cap in CASES:
        twin = 16 if name.startswith("tiny") else 32
        if batch == 24:  # the batch-24 job's twin keeps its batch (m < p at a large micro-batch), at a cap 8% lower
            twin, cap = 24, cap * 0.92
        jobs.append((f"{name.split(',')[0]}, hidden twin of '{name}', batch {twin}, cap {cap:,.0f} B", model, cluster,
                     n_gpus, twin, precision, cap))
    exact = [k for k, job in enumerate(CASES) if job[0].endswith(" B")]  # the cap filled to the byte
    for k in exact:  # the twin's own optimum under the original's cap, whose memory becomes the twin's cap
        name, model, cluster, n_gpus, batch, precision, cap = jobs[k]
        filled = optimum(model, cluster, n_gpus, batch, precision, cap)[0].memory.total
        jobs[k] = (name, model, cluster, n_gpus, batch, precision, filled)
    return jobs


__all__ = ["divisors", "lab_plans", "optimum", "optimum_row", "optima", "differences", "table_source", "blame"]


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def lab_plans(model, cluster, n_gpus, global_batch, precision):
    """Every valid plan of the lab's space, with its estimate: the judge's own search (not best_plans)."""
    for tp in (t for t in divisors(cluster.gpus_per_node) if n_gpus % t == 0):
        for pp in divisors(n_gpus // tp):
            for mb, v, zero, ckpt in itertools.product(*SPACE.values()):
                try:
                    plan = planner.Plan(global_batch, mb, n_gpus // (tp * pp), tp, pp, v, zero, precision, ckpt, tp > 1)
                    yield plan, planner.estimate(model, plan, cluster)
                except ValueError:
                    continue


def optimum(model, cluster, n_gpus, global_batch, precision, cap, strict=False):
    """(Estimate, Plan) of the fastest plan of the lab's space under the cap (strictly under it when ``strict``)."""
    under = [(e, p) for p, e in lab_plans(model, cluster, n_gpus, global_batch, precision)
             if (e.memory.total < cap if strict else e.memory.total <= cap)]
    if not under:
        raise ValueError(f"no plan of the lab's space fits {cap:,.0f} B: {model} on {n_gpus} x {cluster}")
    return min(under, key=lambda pair: pair[0].step_time)


def optimum_row(model, cluster, n_gpus, global_batch, precision, cap):
    """A job's row of the checker's ``OPTIMA``, plain data: step_time (s), memory (B per rank), plan (its knobs); and
    where the optimum fills the cap exactly, strict: the fastest step time strictly under the cap (None if none)."""
    est, plan = optimum(model, cluster, n_gpus, global_batch, precision, cap)
    knobs = dict(zip(("dp", "tp", "pp"), plan_knobs(plan)["mesh"]), **{k: v for k, v in plan_knobs(plan).items()
                                                                       if k != "mesh"})
    row = dict(step_time=est.step_time, memory=est.memory.total, plan=knobs)
    if est.memory.total == cap:  # the boundary job: a search that refuses a plan filling the cap finds this one
        try:
            row["strict"] = optimum(model, cluster, n_gpus, global_batch, precision, cap, strict=True)[0].step_time
        except ValueError:
            row["strict"] = None
    return row


def optima(jobs=JOBS):
    """{job: optimum_row} for ``jobs`` ((name, model, cluster, n_gpus, global_batch, precision, cap) tuples)."""
    return {job: optimum_row(*args) for job, *args in jobs}


def differences(stored, found=None):
    """Where ``stored`` (the checker's OPTIMA) is not what the search finds now (``found``, default ``optima()``), one
    line per job: [] when every row is the search's, to the last bit of every number."""
    found = optima() if found is None else found
    lines = [f"{job}: stored {stored.get(job)!r}, found {row!r}" for job, row in found.items()
             if stored.get(job) != row]
    return lines + [f"{job}: stored, but not a job of JOBS" for job in stored if job not in found]


def table_source(rows):
    """``rows`` (``optima()``) as the Python source of the checker's ``OPTIMA``: numbers as ``repr`` writes them, which
    reads back as the same float."""
    lines = ["OPTIMA = {"]
    for job, row in rows.items():
        strict = f", strict={row['strict']!r}" if "strict" in row else ""
        plan = ", ".join(f"{k}={json.dumps(v)}" for k, v in row["plan"].items())
        lines += [f"    {json.dumps(job)}: dict(step_time={row['step_time']!r}, memory={row['memory']!r},",
                  f"        plan=dict({plan}){strict}),"]
    return "\n".join(lines + ["}"])


def blame(plan, est, model, cluster, n_gpus, global_batch, precision, cap):
    """The knobs that, held at ``plan``'s values, leave no plan under the cap faster than ``est``: what its search never
    varied. One knob, else the first pair that does, else none ([]); "pipeline_starved" for the mesh or micro-batch
    when the plan's pipeline has fewer micro-batches than stages."""
    mine = plan_knobs(plan)
    under = [(plan_knobs(p), e.step_time) for p, e in lab_plans(model, cluster, n_gpus, global_batch, precision)
             if e.memory.total <= cap]

    def explains(knobs):
        return min(t for k, t in under if all(k[n] == mine[n] for n in knobs)) >= est.step_time * (1 - 1e-9)

    blamed = [k for k in KNOBS if explains((k,))] or next(
        (list(pair) for pair in itertools.combinations(KNOBS, 2) if explains(pair)), [])
    starved = plan.pp > 1 and plan.microbatches < plan.pp
    return list(dict.fromkeys("pipeline_starved" if k in ("micro_batch", "mesh") and starved else k for k in blamed))


if __name__ == "__main__":
    print(table_source(optima()))


HIDDEN_JOBS = _hidden_jobs()
