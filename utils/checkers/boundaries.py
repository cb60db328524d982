"""The hard cases a checker must try, from one place (issue 36): the sizes where an answer right on easy inputs breaks.

Every checker of the labs draws its boundary inputs from here, each with its *kind*, so that a test can ask which
kinds a checker covers and plant an answer that only that kind catches (tests/test_checkers_boundaries.py):

- ``check_world_sizes``: the lab's own sizes and the notebook's ``WORLD_SIZE``, plus a non-power-of-two above 4 that
  the lab accepts, two over a power of two where it can (6: left out under ``SMOKE``, so that the test suite keeps
  its time): an answer written for 2 and 4 ranks, for powers of two, or for one extra rank, fails there;
- ``element_counts``: tensor lengths for p ranks: a multiple of p, 1, fewer than p (ranks with nothing), remainders
  of 1 and 2, and a large odd count;
- ``bucket_caps``: caps in the unit of ``sizes`` (bytes or elements, in the order buckets fill) for the rule "a
  bucket is closed once it holds the cap or more": one bucket for all, one tensor a bucket, a cap reached inside a
  tensor, the first bucket filled exactly, a later one filled exactly, and a later one left one unit short (a count
  that restarts at -1 or +1 after the first bucket differs only there);
- ``FAR_APART``: offsets of logits or scores whose exponential overflows (``large``) or underflows (``apart``)
  float32: a softmax or log-sum-exp that does not subtract the maximum fails there.
"""

__all__ = ["FAR_APART", "bucket_caps", "buckets", "check_world_sizes", "element_counts", "first_non_power_of_two_above_4", "kinds",
           ]

# float32's exp overflows above ~88.72 (log of its largest, 3.4e38) and is 0 below ~-103.97 (its smallest subnormal)
FAR_APART = {"large": 200.0, "apart": -120.0}


def first_non_power_of_two_above_4(accepted):
    """The world size above 4 that the lab accepts and that folds the most: not a power of two, and at least 2 over
    the power of two below it (6 = 4 + 2: two ranks fold, where 3 and 5 fold one, so a fold written for one extra
    rank fails there; found by make mutants on lab 01b), else any non-power-of-two above 4, or None (labs of powers
    of two only: 01a and 09)."""
    def extra(n):
        return n - (1 << (n.bit_length() - 1))
    above = sorted(n for n in accepted if n > 4 and extra(n))
    return next((n for n in above if extra(n) >= 2), above[0] if above else None)


def check_world_sizes(base, world_size, smoke=False, accepted=range(2, 7)):
    """The world sizes a check runs: ``base`` (the lab's own), the notebook's ``world_size``, and unless ``smoke`` the
    non-power-of-two above 4 of ``first_non_power_of_two_above_4(accepted)``; sorted, once each."""
    if world_size not in accepted and world_size not in base:
        raise ValueError(f"WORLD_SIZE = {world_size}: this lab's checker accepts {sorted(accepted)}; pick one of them.")
    extra = first_non_power_of_two_above_4(accepted)
    return sorted({*base, world_size, *([extra] if extra and not smoke else [])})


def element_counts(p):
    """(numel, kind) pairs for p ranks; the first one cuts evenly into p chunks."""
    found = [(4 * p, "multiple"), (1, "one"), (max(1, p - 1), "fewer_than_ranks")]
    found += [(n, "remainder" if n % p else "multiple") for n in (4 * p + 1, 4 * p + 2)] + [(25_003, "large_odd")]
    seen, cases = set(), []
    for numel, kind in found:  # on 2 ranks "one" and "fewer than ranks" are both 1
        if numel not in seen:
            seen.add(numel)
            cases.append((numel, kind))
    return cases


def buckets(sizes, cap, restart=0):
    """The buckets (lists of indices into ``sizes``) made by the rule: a bucket is closed once it holds ``cap`` or
    more; a new one counts from ``restart`` (0: right; the tests plant -1 and +1)."""
    out, size = [[]], 0
    for i, s in enumerate(sizes):
        if size >= cap:
            out.append([])
            size = restart
        out[-1].append(i)
        size += s
    return out


def bucket_caps(sizes, round_caps=()):
    """(cap, kind) pairs for tensors of ``sizes`` (in the order buckets fill). ``round_caps``: caps a lab names in
    its text (1 MB, 4 KB), each given the kind it turns out to be; the boundary ones are computed: the first bucket
    filled exactly, a later one filled exactly and a later one left one unit short. A ValueError if ``sizes`` has no
    later bucket that can be filled exactly (fewer than three tensors)."""
    total = sum(sizes)

    def kind_of(cap):
        if cap <= 1:
            return "one_per_tensor"
        if cap > total:
            return "one_for_all"
        made = buckets(sizes, cap)
        if any(sum(sizes[i] for i in b) == cap for b in made):
            return "fills_exactly"
        return "inside_a_tensor"

    cases = [(cap, kind_of(cap)) for cap in round_caps]
    cases.append((sizes[0] + sizes[1], "fills_exactly_first"))  # the first two tensors, to the unit
    for cap in sorted(set(sizes) | {a + b for a, b in zip(sizes, sizes[1:])}):
        made = buckets(sizes, cap)
        later = [sum(sizes[i] for i in b) for b in made[1:-1]]  # closed buckets after the first
        if cap in later and cap not in [sum(sizes[i] for i in made[0])]:
            cases += [(cap, "fills_exactly_later"), (cap + 1, "one_short_later")]
            break
    else:
        raise ValueError(f"sizes {sizes}: no cap fills a bucket after the first exactly; give at least three tensors")
    cases.append((1, "one_per_tensor"))
    out, seen = [], set()
    for cap, kind in cases:
        if cap not in seen:
            seen.add(cap)
            out.append((cap, kind))
    return out


def kinds(cases):
    """The kinds of a list of (value, kind) pairs."""
    return {kind for _, kind in cases}

