#!/usr/bin/env python3
"""Summarises a `train_yolo --timeline FILE` trace: for each kept step, the device's work from its
first span to its last, the time inside that no span covers (idle between kernels), and the gap
from the step's last span to the next step's first (the step boundary: the host's loss read,
bookkeeping and next launch, when the device has nothing queued). Python 3, standard library only.

  python3 tools/timeline_summary.py timeline.json
"""
import json
import re
import sys


def covered_ms(spans):
    """Time (ms) that at least one of the (start, end) spans covers."""
    total, run_start, run_end = 0.0, None, None
    for start, end in sorted(spans):
        if run_end is None or start > run_end:
            if run_end is not None:
                total += run_end - run_start
            run_start, run_end = start, end
        else:
            run_end = max(run_end, end)
    if run_end is not None:
        total += run_end - run_start
    return total


def summarise(events):
    """Per step: (step, first span ms, last span ms, busy ms, top kernels). Times in ms."""
    windows = {}  # step -> [begin, end] of its micro-batches' windows
    for e in events:
        if e.get("cat") != "host":
            continue
        m = re.match(r"step (\d+):", e.get("name", ""))
        if not m:
            continue
        step = int(m.group(1))
        begin, end = e["ts"] / 1000, (e["ts"] + e["dur"]) / 1000
        w = windows.setdefault(step, [begin, end])
        w[0], w[1] = min(w[0], begin), max(w[1], end)
    spans = [(e["ts"] / 1000, (e["ts"] + e["dur"]) / 1000, e["name"]) for e in events if e.get("cat") == "device"]
    rows = []
    for step in sorted(windows):
        begin, end = windows[step]
        inside = [s for s in spans if s[0] < end and s[1] > begin]
        if not inside:
            rows.append((step, None, None, 0.0, []))
            continue
        by_name = {}
        for start, stop, name in inside:
            by_name[name] = by_name.get(name, 0.0) + (stop - start)
        top = sorted(by_name.items(), key=lambda kv: -kv[1])[:3]
        rows.append((step, min(s[0] for s in inside), max(s[1] for s in inside),
                     covered_ms([(s[0], s[1]) for s in inside]), top))
    return rows


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:
        with open(argv[1]) as f:
            events = json.load(f)["traceEvents"]
    except (OSError, ValueError, KeyError) as e:
        print(f"timeline_summary: {argv[1]}: {e}", file=sys.stderr)
        return 2
    rows = summarise(events)
    if not rows:
        print(f"timeline_summary: {argv[1]}: no steps in it")
        return 1
    print("step   device ms   busy ms   idle ms   gap to next step ms   top kernels (ms)")
    for k, (step, first, last, busy, top) in enumerate(rows):
        if first is None:
            print(f"{step:4d}   no device spans recorded")
            continue
        nxt = rows[k + 1][1] if k + 1 < len(rows) else None
        gap = f"{nxt - last:.3f}" if nxt is not None else "-"
        kernels = ", ".join(f"{name[:40]} {ms:.2f}" for name, ms in top)
        print(f"{step:4d} {last - first:11.3f} {busy:9.3f} {last - first - busy:9.3f} {gap:>21}   {kernels}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
