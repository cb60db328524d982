"""``make mutants``: the mutation score of each lab's checker, a table per lab, build/mutants/<lab>.json.

    python -m utils.course.mutants                      # every lab, the one with the fewest mutants first
    python -m utils.course.mutants --lab 06_pipeline_lab --sample 30 --seed 0
    python -m utils.course.mutants --list               # how many mutants of each kind, nothing run
    python -m utils.course.mutants --table              # the table and the misses again, from build/mutants/*.json
    python -m utils.course.mutants --record             # store the full runs in utils/course/mutation_scores.json
"""

import argparse
import collections
import json
from pathlib import Path

from utils.checkers.labs import LABS
from utils.course.notebook_runner import ROOT

from .mutate import KINDS, mutants
from .run import LabScore, run_lab

HEADER = f"{'lab':<32} {'mutants':>8} {'equiv.':>7} {'named':>6} {'unnamed':>8} {'missed':>7} {'score':>7} " \
         f"{'named %':>8} {'minutes':>8}"


def row(score):
    tried = f"{score.tried}/{score.mutants}" if score.tried < score.mutants else f"{score.mutants}"
    return (f"{score.lab:<32} {tried:>8} {score.equivalent:>7} {score.named:>6} {score.unnamed:>8} {score.missed:>7} "
            f"{100 * score.score:>6.1f}% {100 * score.named_share:>7.1f}% {score.seconds / 60:>8.1f}")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m utils.course.mutants", description=__doc__.splitlines()[0])
    parser.add_argument("--lab", action="append", choices=sorted(LABS), help="this lab only (repeatable)")
    parser.add_argument("--sample", type=int, help="run this many mutants per lab, drawn with --seed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, help="run at most the first N (of the sample)")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "mutants")
    parser.add_argument("--list", action="store_true", help="count each lab's mutants by kind, run nothing")
    parser.add_argument("--table", action="store_true", help="print the table and the misses of the last runs")
    parser.add_argument("--record", action="store_true", help="store the last full runs (build/mutants) in "
                        "utils/course/mutation_scores.json and the README's table; then `make guide`")
    args = parser.parse_args(argv)
    if args.table:
        return stored(args.out, args.lab)
    if args.record:
        from .scores import SCORES, record
        print(f"recorded {', '.join(record(args.out, args.lab))} in {SCORES.relative_to(ROOT)} and README.md")
        return None
    counts = {name: mutants((ROOT / "labs" / "solutions" / f"{lab.solution}.py").read_text(), lab.answers)
              for name, lab in LABS.items() if not args.lab or name in args.lab}
    order = sorted(counts, key=lambda name: len(counts[name]))
    if args.list:
        print(f"{'lab':<32} {'mutants':>8}  " + " ".join(f"{kind:>10}" for kind in KINDS))
        for name in order:
            kinds = collections.Counter(m.kind for m in counts[name])
            print(f"{name:<32} {len(counts[name]):>8}  " + " ".join(f"{kinds[kind]:>10}" for kind in KINDS))
        return
    scores = []
    for name in order:
        print(f"{name}: {len(counts[name])} mutants", flush=True)
        scores.append(run_lab(name, args.sample, args.limit, args.seed, args.out,
                              echo=lambda line: print(line, flush=True)))
        print(HEADER, row(scores[-1]), sep="\n", flush=True)
    print("\n" + HEADER)
    for score in scores:
        print(row(score))
    print(f"score = rejected / (mutants - equivalent); named % = rejected with a named mistake / the same; "
          f"misses in {args.out}/<lab>.json")


def stored(out, labs=None):
    """The table and every miss (its diff line, what the oracle saw) from the JSON files of earlier runs."""
    reports = [json.loads(path.read_text()) for path in sorted(Path(out).glob("*.json"))
               if not labs or path.stem in labs]
    fields = ("lab", "mutants", "tried", "equivalent", "named", "unnamed", "missed", "seconds")
    scores = [LabScore(**{k: report[k] for k in fields}) for report in reports]
    print(HEADER)
    for score in sorted(scores, key=lambda s: s.mutants):
        print(row(score))
    for report in reports:
        for miss in report["misses"]:
            print(f"miss {report['lab']} #{miss['index']} {miss['diff']}\n    oracle: {miss['oracle']}")


if __name__ == "__main__":
    main()
