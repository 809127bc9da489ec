#!/usr/bin/env python3
"""Tables, ratios and issue-4 targets from criterion's saved estimates.

Run after `cargo bench --bench limiters`:

    python3 benches/summarize.py [target/criterion]

Reads the median of each benchmark's `new/estimates.json` (ns per check; for the `_2t` group,
aggregate ns per check across both threads) and prints markdown.
"""

import json
import os
import sys

ROOT = sys.argv[1] if len(sys.argv) > 1 else os.path.join("target", "criterion")
SIZES = ["1k", "100k", "1m"]


def median(*parts):
    path = os.path.join(ROOT, *parts, "new", "estimates.json")
    try:
        with open(path) as f:
            return json.load(f)["median"]["point_estimate"]
    except FileNotFoundError:
        return None


def fmt(x, digits=1):
    return "–" if x is None else f"{x:.{digits}f}"


def ratio(a, b):
    return None if a is None or b is None else a / b


def mark(value, target, at_least=True):
    if value is None:
        return "not measured"
    ok = value >= target if at_least else value <= target
    return ("**met**" if ok else "**not met**")


targets = []

# --- direct_gcra -------------------------------------------------------------------------------
d = {f: median("direct_gcra", f) for f in [
    "tollgate", "tollgate_coarse", "governor", "governor_coarse", "floor", "floor_coarse",
    "tollgate_deny", "tollgate_coarse_deny", "governor_deny", "governor_coarse_deny"]}
print("### direct_gcra (ns per check, median)\n")
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
    g = fmt(ratio(d[gov], d[f]), 2) + "×" if gov else ""
    fl = fmt(ratio(d[f], d[floor]), 2) + "×" if floor else ""
    print(f"| `{f}` | {clock} | {fmt(d[f])} | {g} | {fl} |")
print()
r = ratio(d["tollgate"], d["floor"])
targets.append(("direct: `tollgate` ≤ 1.1 × `floor`", f"{fmt(r, 2)}×", mark(r, 1.1, False)))
r = ratio(d["tollgate_coarse"], d["governor_coarse"])
targets.append(("direct: `tollgate_coarse` ≤ 1.1 × `governor_coarse`", f"{fmt(r, 2)}×",
                mark(r, 1.1, False)))

# --- keyed_gcra, keyed_gcra_2t -----------------------------------------------------------------
ROWS = ["tollgate", "governor", "floor", "tollgate_coarse", "governor_coarse", "floor_coarse",
        "floor_dashmap_coarse"]
for group, threads in [("keyed_gcra", 1), ("keyed_gcra_2t", 2)]:
    k = {(f, s): median(group, f, s) for f in ROWS for s in SIZES}
    what = "ns per check" if threads == 1 else "aggregate ns per check over 2 threads (Mops/s = 1000 / ns)"
    print(f"### {group} ({what}, median)\n")
    print("| function | clock | " + " | ".join(SIZES) + " |")
    print("|---|---|" + "---|" * len(SIZES))
    for f in ROWS:
        clock = "coarse" if "coarse" in f else "precise"
        cells = []
        for s in SIZES:
            v = k[(f, s)]
            cells.append(fmt(v) if threads == 1 else f"{fmt(v)} ({fmt(ratio(1000, v) if v else None)} Mops/s)")
        print(f"| `{f}` | {clock} | " + " | ".join(cells) + " |")
    print()
    print("| ratio | " + " | ".join(SIZES) + " |")
    print("|---|" + "---|" * len(SIZES))
    for label, a, b in [
        ("governor / tollgate (precise)", "governor", "tollgate"),
        ("governor_coarse / tollgate_coarse", "governor_coarse", "tollgate_coarse"),
        ("tollgate / floor (precise)", "tollgate", "floor"),
        ("tollgate_coarse / floor_coarse", "tollgate_coarse", "floor_coarse"),
        ("tollgate_coarse / floor_dashmap_coarse", "tollgate_coarse", "floor_dashmap_coarse"),
    ]:
        print(f"| {label} | " + " | ".join(fmt(ratio(k[(a, s)], k[(b, s)]), 2) + "×" for s in SIZES) + " |")
    print()
    deny = {f: median(group, f, "100k") for f in
            ["tollgate_deny", "governor_deny", "tollgate_coarse_deny", "governor_coarse_deny"]}
    print("Deny path at 100k: " + ", ".join(f"`{f}` {fmt(v)} ns" for f, v in deny.items())
          + f"; governor / tollgate {fmt(ratio(deny['governor_deny'], deny['tollgate_deny']), 2)}× precise, "
          + f"{fmt(ratio(deny['governor_coarse_deny'], deny['tollgate_coarse_deny']), 2)}× coarse.\n")
    if threads == 1:
        need_p = {"1k": 1.6, "100k": 1.6, "1m": 1.1}
        need_c = {s: 2.5 for s in SIZES}
    else:
        need_p = {"1k": 1.8, "100k": 1.8, "1m": 1.4}
        need_c = {s: 3.5 for s in SIZES}
    for s in SIZES:
        r = ratio(k[("governor", s)], k[("tollgate", s)])
        targets.append((f"`{group}` precise {s}: governor / tollgate ≥ {need_p[s]}", f"{fmt(r, 2)}×",
                        mark(r, need_p[s])))
    for s in SIZES:
        r = ratio(k[("governor_coarse", s)], k[("tollgate_coarse", s)])
        targets.append((f"`{group}` coarse {s}: governor / tollgate ≥ {need_c[s]}", f"{fmt(r, 2)}×",
                        mark(r, need_c[s])))

# --- keyed_algos -------------------------------------------------------------------------------
ALGOS = ["gcra", "leaky_queue", "fixed_window", "sliding_window", "sliding_log"]
a = {f: median("keyed_algos", f, "100k") for f in ALGOS + [x + "_deny" for x in ALGOS]}
print("### keyed_algos (100k keys, precise clock, ns per check, median)\n")
print("| algorithm | allowed ns/op | / gcra | deny ns/op | / gcra_deny |")
print("|---|---|---|---|---|")
for f in ALGOS:
    print(f"| `{f}` | {fmt(a[f])} | {fmt(ratio(a[f], a['gcra']), 2)}× | {fmt(a[f + '_deny'])} | "
          f"{fmt(ratio(a[f + '_deny'], a['gcra_deny']), 2)}× |")
print()
for f in ALGOS[1:4]:
    r = ratio(a[f], a["gcra"])
    targets.append((f"`keyed_algos` {f} ≤ 1.3 × gcra", f"{fmt(r, 2)}×", mark(r, 1.3, False)))
mops = ratio(1000, a["sliding_log"]) if a["sliding_log"] else None
targets.append(("`keyed_algos` sliding_log ≥ 5 M checks/s (L = 64)", f"{fmt(mops, 2)} M/s",
                mark(mops, 5.0)))

print("### Targets (issue 4)\n")
print("| target | measured | |")
print("|---|---|---|")
for t, v, m in targets:
    print(f"| {t} | {v} | {m} |")
