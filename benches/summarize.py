#!/usr/bin/env python3
"""Tables, ratios and targets from criterion's saved estimates.

After one run (`cargo bench --bench limiters`):

    python3 benches/summarize.py

After several runs saved as baselines (`cargo bench --bench limiters -- --save-baseline run1`,
then run2, run3):

    python3 benches/summarize.py run1 run2 run3

A benchmark's figure in one run is criterion's median (ns per check; for the `_2t` group,
aggregate ns per check across both threads). Over several runs, the tables show the median over
the runs and [min–max]; a ratio is computed within each run (both figures from the same run) and
the median of those per-run ratios is shown. Prints markdown. The criterion directory is
`target/criterion` unless CRITERION_DIR says otherwise.
"""

import json
import os
import statistics
import sys

ROOT = os.environ.get("CRITERION_DIR", os.path.join("target", "criterion"))
BASELINES = sys.argv[1:] or ["new"]
SIZES = ["1k", "100k", "1m"]


def runs(*parts):
    """{baseline: median ns} for one benchmark ID."""
    found = {}
    for baseline in BASELINES:
        path = os.path.join(ROOT, *parts, baseline, "estimates.json")
        try:
            with open(path) as f:
                found[baseline] = json.load(f)["median"]["point_estimate"]
        except FileNotFoundError:
            pass
    return found


def value(*parts):
    r = runs(*parts)
    return statistics.median(r.values()) if r else None


def cell(*parts):
    """The median over runs, with [min–max] when there are several."""
    r = runs(*parts)
    if not r:
        return "–"
    text = f"{statistics.median(r.values()):.1f}"
    if len(r) > 1:
        text += f" [{min(r.values()):.0f}–{max(r.values()):.0f}]"
    return text


def ratio(a, b):
    """Median over runs of a/b, each run's a over the same run's b."""
    ra, rb = runs(*a), runs(*b)
    per_run = [ra[k] / rb[k] for k in ra if k in rb and rb[k]]
    return statistics.median(per_run) if per_run else None


def fmt(x, digits=2, suffix="×"):
    return "–" if x is None else f"{x:.{digits}f}{suffix}"


def mark(x, target, at_least=True):
    if x is None:
        return "not measured"
    return "**met**" if (x >= target if at_least else x <= target) else "**not met**"


targets = []
print(f"Runs: {', '.join(BASELINES)}.\n")

# --- direct_gcra -------------------------------------------------------------------------------
D = "direct_gcra"
print("### direct_gcra (ns per check)\n")
print("| function | clock | ns/op | governor / tollgate | tollgate / floor |")
print("|---|---|---|---|---|")
for f, clock, gov, floor in [
    ("tollgate", "precise", "governor", "floor"),
    ("tollgate_coarse", "coarse", "governor_coarse", "floor_coarse"),
    ("governor", "precise", None, None),
    ("governor_coarse", "coarse", None, None),
    ("floor", "precise", None, None),
    ("floor_coarse", "coarse", None, None),
    ("tollgate_deny", "precise", "governor_deny", "floor"),
    ("tollgate_coarse_deny", "coarse", "governor_coarse_deny", "floor_coarse"),
    ("governor_deny", "precise", None, None),
    ("governor_coarse_deny", "coarse", None, None),
]:
    g = fmt(ratio((D, gov), (D, f))) if gov else ""
    fl = fmt(ratio((D, f), (D, floor))) if floor else ""
    print(f"| `{f}` | {clock} | {cell(D, f)} | {g} | {fl} |")
print()
r = ratio((D, "tollgate"), (D, "floor"))
targets.append(("direct: `tollgate` ≤ 1.1 × `floor`", fmt(r), mark(r, 1.1, False)))
r = ratio((D, "tollgate_coarse"), (D, "governor_coarse"))
targets.append(("direct: `tollgate_coarse` ≤ 1.1 × `governor_coarse`", fmt(r), mark(r, 1.1, False)))

# --- keyed_gcra, keyed_gcra_2t -----------------------------------------------------------------
ROWS = ["tollgate", "governor", "floor", "tollgate_coarse", "tollgate_dashmap_coarse",
        "governor_coarse", "floor_coarse", "floor_dashmap_coarse"]
for group, threads in [("keyed_gcra", 1), ("keyed_gcra_2t", 2)]:
    what = ("ns per check" if threads == 1
            else "aggregate ns per check over 2 threads; Mops/s = 1000 / ns")
    print(f"### {group} ({what})\n")
    print("| function | clock | " + " | ".join(SIZES) + " |")
    print("|---|---|" + "---|" * len(SIZES))
    for f in ROWS:
        clock = "coarse" if "coarse" in f else "precise"
        cells = []
        for s in SIZES:
            text = cell(group, f, s)
            v = value(group, f, s)
            if threads > 1 and v:
                text += f" ({1000 / v:.1f} Mops/s)"
            cells.append(text)
        print(f"| `{f}` | {clock} | " + " | ".join(cells) + " |")
    print()
    print("| ratio (median of per-run ratios) | " + " | ".join(SIZES) + " |")
    print("|---|" + "---|" * len(SIZES))
    for label, a, b in [
        ("governor / tollgate (precise)", "governor", "tollgate"),
        ("governor_coarse / tollgate_coarse", "governor_coarse", "tollgate_coarse"),
        ("tollgate / floor (precise)", "tollgate", "floor"),
        ("tollgate_coarse / floor_coarse", "tollgate_coarse", "floor_coarse"),
        ("tollgate_coarse / floor_dashmap_coarse", "tollgate_coarse", "floor_dashmap_coarse"),
        ("governor / floor (precise)", "governor", "floor"),
        ("governor_coarse / floor_coarse", "governor_coarse", "floor_coarse"),
    ]:
        print(f"| {label} | "
              + " | ".join(fmt(ratio((group, a, s), (group, b, s))) for s in SIZES) + " |")
    print()
    print("Deny path at 100k (ns per check): "
          + ", ".join(f"`{f}` {cell(group, f, '100k')}" for f in
                      ["tollgate_deny", "governor_deny", "tollgate_coarse_deny",
                       "governor_coarse_deny"])
          + f"; governor / tollgate "
          f"{fmt(ratio((group, 'governor_deny', '100k'), (group, 'tollgate_deny', '100k')))} "
          f"precise, {fmt(ratio((group, 'governor_coarse_deny', '100k'), (group, 'tollgate_coarse_deny', '100k')))} "
          "coarse.\n")
    if threads == 1:
        need_p, need_c = {"1k": 1.6, "100k": 1.6, "1m": 1.1}, {s: 2.5 for s in SIZES}
    else:
        need_p, need_c = {"1k": 1.8, "100k": 1.8, "1m": 1.4}, {s: 3.5 for s in SIZES}
    for s in SIZES:
        r = ratio((group, "governor", s), (group, "tollgate", s))
        targets.append((f"`{group}` precise {s}: governor / tollgate ≥ {need_p[s]}", fmt(r),
                        mark(r, need_p[s])))
    for s in SIZES:
        r = ratio((group, "governor_coarse", s), (group, "tollgate_coarse", s))
        targets.append((f"`{group}` coarse {s}: governor / tollgate ≥ {need_c[s]}", fmt(r),
                        mark(r, need_c[s])))

# --- keyed_algos -------------------------------------------------------------------------------
A = "keyed_algos"
ALGOS = ["gcra", "leaky_queue", "fixed_window", "sliding_window", "sliding_log"]
print("### keyed_algos (100k keys, precise clock, ns per check)\n")
print("| algorithm | allowed ns/op | / gcra | deny ns/op | / gcra_deny |")
print("|---|---|---|---|---|")
for f in ALGOS:
    print(f"| `{f}` | {cell(A, f, '100k')} | {fmt(ratio((A, f, '100k'), (A, 'gcra', '100k')))} | "
          f"{cell(A, f + '_deny', '100k')} | "
          f"{fmt(ratio((A, f + '_deny', '100k'), (A, 'gcra_deny', '100k')))} |")
print()
for f in ALGOS[1:4]:
    r = ratio((A, f, "100k"), (A, "gcra", "100k"))
    targets.append((f"`keyed_algos` {f} ≤ 1.3 × gcra", fmt(r), mark(r, 1.3, False)))
v = value(A, "sliding_log", "100k")
mops = 1000 / v if v else None
targets.append(("`keyed_algos` sliding_log ≥ 5 M checks/s (L = 64)", fmt(mops, 2, " M/s"),
                mark(mops, 5.0)))

print("### Targets\n")
print("| target | measured | |")
print("|---|---|---|")
for t, v, m in targets:
    print(f"| {t} | {v} | {m} |")
