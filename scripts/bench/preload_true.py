#!/usr/bin/env python3
"""What preloading a library costs a process that does nothing: RUNS interleaved runs of /bin/true
pinned to CPU 1, once per side, the order rotating every run; prints each side's median paired
difference against the first side [interquartile range] (docs/BENCHMARKS.md, "Start-up without
libgcc_s").

Usage: scripts/bench/preload_true.py RUNS NAME=LIBRARY...   (an empty LIBRARY: nothing preloaded)
  e.g. scripts/bench/preload_true.py 600 none= gcc=/lib/x86_64-linux-gnu/libgcc_s.so.1 \
         old=/work/wt/old.so new=/work/wt/new.so
"""
import os,subprocess,time,statistics,sys
os.sched_setaffinity(0,{1})
sides=[(k,v) for k,v in (a.split('=',1) for a in sys.argv[2:])]
if len(sys.argv) < 4: sys.exit(__doc__)
runs=int(sys.argv[1]); t={k:[] for k,_ in sides}
for i in range(runs):
    for k,v in sides[i%len(sides):]+sides[:i%len(sides)]:
        e=dict(PATH="/usr/bin:/bin"); 
        if v: e["LD_PRELOAD"]=v
        s=time.perf_counter_ns(); subprocess.run(["/bin/true"],env=e); t[k].append(time.perf_counter_ns()-s)
b=t[sides[0][0]]
for k,_ in sides[1:]:
    d=[x-y for x,y in zip(t[k],b)]; q=statistics.quantiles(d,n=4)
    print(f"{k}: +{statistics.median(d)/1e3:.0f} us [{q[0]/1e3:.0f}..{q[2]/1e3:.0f}]  base median {statistics.median(b)/1e3:.0f} us")
