#!/usr/bin/env python3
"""Reads callgrind output files (one event: Ir) written by scripts/bench.sh.

  callgrind_report.py total FILE N
      Instructions collected (the --toggle-collect'ed loop) divided by N.
  callgrind_report.py breakdown FILE N SHIM_OBJECT REAL_FN[,REAL_FN...] [TOP]
      Where the shim's instructions go, per iteration: the self cost of every function in SHIM_OBJECT,
      plus the inclusive cost of each call the shim makes into another object (libc, the loader, the
      driver), except the calls to REAL_FN in the driver (the real work the hook forwards). Their sum is
      the shim's own cost; it is printed with the top TOP entries.

Only the parts of the format callgrind writes with its defaults are handled: name compression
("(id) name"), ob/fl/fi/fe/fn and cob/cfi/cfl/cfn, calls= followed by the call's inclusive cost line;
and the extra position column of `--dump-instr=yes` ("positions: instr line"), whose jump lines are
skipped, so that the files of a line-by-line attribution (docs/BENCHMARKS.md) read the same.
"""
import collections
import sys


def parse(path):
    """Returns (self_cost[(ob, fn)], calls[((ob, fn), (cob, cfn))] inclusive, summary)."""
    names = {"ob": {}, "fn": {}}
    self_cost = collections.Counter()
    calls = collections.Counter()
    summary = None
    ob = fn = None
    cob = cfn = None
    pending_call = False
    npos = 1  # position columns before the cost ("positions: instr line" with --dump-instr=yes)

    def name(kind, value):
        table = names[kind]
        value = value.strip()
        if value.startswith("("):
            close = value.index(")")
            ident = value[1:close]
            rest = value[close + 1 :].strip()
            if rest:
                table[ident] = rest
            return table.get(ident, ident)
        return value

    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            key, sep, value = line.partition("=")
            if sep and key.isalpha():
                if key == "ob":
                    ob = name("ob", value)
                elif key == "fn":
                    fn = name("fn", value)
                    cob = cfn = None
                elif key == "cob":
                    cob = name("ob", value)
                elif key == "cfn":
                    cfn = name("fn", value)
                elif key == "calls":
                    pending_call = True
                # fl, fi, fe, cfi, cfl, jump, jcnd: files and jumps, not needed here.
                continue
            if line.startswith("positions:"):
                npos = len(line.split()) - 1
                continue
            if line.startswith("summary:"):
                summary = int(line.split()[1])
                continue
            if not (line[0].isdigit() or line[0] in "+-*"):
                continue  # other headers (version, creator, events, ...)
            parts = line.split()
            cost = int(parts[npos]) if len(parts) > npos else 0
            if pending_call:
                calls[((ob, fn), (cob if cob is not None else ob, cfn))] += cost
                pending_call = False
                cob = cfn = None
            else:
                self_cost[(ob, fn)] += cost
    return self_cost, calls, summary


def short(ob):
    return ob.rsplit("/", 1)[-1] if ob else "?"


def main():
    cmd, path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    self_cost, calls, summary = parse(path)
    if summary is None:
        summary = sum(self_cost.values())
    if cmd == "total":
        print(f"{summary / n:.1f}")
        return
    if cmd != "breakdown":
        sys.exit(f"unknown command {cmd}")
    shim = sys.argv[4]
    real_fns = set(sys.argv[5].split(","))
    top = int(sys.argv[6]) if len(sys.argv) > 6 else 15
    in_shim = lambda ob: ob is not None and ob.endswith(shim)
    entries = collections.Counter()
    forwarded = 0
    for (ob, fn), c in self_cost.items():
        if in_shim(ob):
            entries[(f"{fn}", "self")] += c
    for ((ob, fn), (cob, cfn)), c in calls.items():
        if not in_shim(ob) or in_shim(cob):
            continue
        if cfn in real_fns:
            forwarded += c
            continue
        entries[(f"{cfn} [{short(cob)}]", "called")] += c
    shim_total = sum(entries.values())
    print(f"shim's own instructions per iteration: {shim_total / n:.0f} "
          f"(forwarded to the real {', '.join(sorted(real_fns))}: {forwarded / n:.0f})")
    print(f"{'Ir/iter':>8}  {'share':>6}  what")
    for (what, kind), c in entries.most_common(top):
        label = what if kind == "self" else f"call {what} (inclusive)"
        print(f"{c / n:8.1f}  {100 * c / max(shim_total, 1):5.1f}%  {label}")


if __name__ == "__main__":
    main()
