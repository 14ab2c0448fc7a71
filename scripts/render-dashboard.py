#!/usr/bin/env python3
"""Renders deploy/grafana/gpuslice.json as a static HTML page from a real Prometheus's answers.

Grafana is not packaged for Debian, so docs/OBSERVABILITY.md's picture is made this way: every panel
of the dashboard is drawn at its grid position, from the results of *its own* PromQL queries sent to
the Prometheus HTTP API (`query_range` for time series, `query` at the end for stat and bar-gauge
panels), with the dashboard's variables expanded as Grafana would ($UUID: every value of the label,
one repeated row per GPU; $__rate_interval: 4 x the scrape interval). Units, legends, dashed
overrides and thresholds come from the panel definitions. What it does not draw: Grafana's own
chrome (menus, time picker) and panel types the dashboard does not use.

usage: render-dashboard.py --prometheus URL --start UNIX --end UNIX [--dashboard FILE]
                           [--rate-interval 4s] [--step 1] > page.html
Standard library only.
"""
import argparse
import html
import json
import math
import re
import urllib.error
import urllib.parse
import urllib.request

COLORS = ["#73bf69", "#f2cc0c", "#5794f2", "#ff9830", "#f2495c", "#b877d9", "#8ab8ff", "#ffb357"]
GRID_W = 1560 / 24
ROW_H = 30


def api(base, path, **params):
    url = f"{base}/api/v1/{path}?{urllib.parse.urlencode(params, doseq=True)}"
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            doc = json.load(r)
    except urllib.error.HTTPError as e:
        raise SystemExit(f"{url}: {e}: {e.read().decode()}")
    if doc.get("status") != "success":
        raise SystemExit(f"{url}: {doc}")
    return doc["data"]


def expand(expr, uuid, rate_interval):
    expr = expr.replace("$__rate_interval", rate_interval)
    # GPU UUIDs are letters, digits and dashes: nothing to escape in a PromQL regex.
    expr = expr.replace("$UUID", uuid if uuid is not None else ".*")
    # The node, namespace and tenant filters: all.
    for var in ("$node", "$namespace", "$tenant"):
        expr = expr.replace(var, ".*")
    return expr


def legend(fmt, metric):
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: metric.get(m.group(1), ""), fmt or "") or str(metric)


def fmt_value(v, unit):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if unit == "bytes":
        for u, n in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
            if abs(v) >= n:
                return f"{v / n:.3g} {u}"
        return f"{v:.0f} B"
    if unit == "percentunit":
        return f"{v * 100:.1f}%"
    if unit == "s":
        return f"{v:.2f} s"
    return f"{v:.3g}"


def threshold_color(panel, v):
    steps = panel.get("fieldConfig", {}).get("defaults", {}).get("thresholds", {}).get("steps", [])
    color = "#73bf69"
    for s in steps:
        if s.get("value") is None or (v is not None and v >= s["value"]):
            color = {"green": "#73bf69", "orange": "#ff9830", "red": "#f2495c"}.get(s["color"], s["color"])
    return color


def panel_box(p, y_offset, inner):
    g = p["gridPos"]
    x, y, w, h = g["x"] * GRID_W + 20, (g["y"] + y_offset) * ROW_H + 70, g["w"] * GRID_W - 8, g["h"] * ROW_H - 8
    title = html.escape(p.get("title", "").replace("$UUID", p.get("_uuid", "")))
    return (f'<div class="panel" style="left:{x:.0f}px;top:{y:.0f}px;width:{w:.0f}px;height:{h:.0f}px">'
            f'<div class="title">{title}</div>{inner(w, h - 28)}</div>')


def timeseries(p, args, uuid):
    defaults = p.get("fieldConfig", {}).get("defaults", {})
    unit = defaults.get("unit", "short")
    dashed = [re.compile(o["matcher"]["options"]) for o in p.get("fieldConfig", {}).get("overrides", [])
              if o["matcher"]["id"] == "byRegexp"]
    bars = defaults.get("custom", {}).get("drawStyle") == "bars"
    series = []
    for t in p["targets"]:
        data = api(args.prometheus, "query_range", query=expand(t["expr"], uuid, args.rate_interval),
                   start=args.start, end=args.end, step=args.step)
        for r in sorted(data["result"], key=lambda r: legend(t.get("legendFormat"), r["metric"])):
            pts = [(float(ts), float(v)) for ts, v in r["values"]]
            series.append((legend(t.get("legendFormat"), r["metric"]), pts))

    def inner(w, h):
        legend_w = 250
        pw, ph = w - legend_w - 70, h - 36
        vals = [v for _, pts in series for _, v in pts if not math.isnan(v)]
        lo = defaults.get("min", min(vals, default=0))
        hi = defaults.get("max", max(vals, default=1))
        if hi <= lo:
            hi = lo + 1
        hi *= 1.0 if "max" in defaults else 1.08
        sx = lambda t: 60 + (t - args.start) / max(args.end - args.start, 1) * pw
        sy = lambda v: 8 + ph - (v - lo) / (hi - lo) * ph
        svg = [f'<svg width="{w - legend_w:.0f}" height="{h:.0f}">']
        for i in range(5):
            v = lo + (hi - lo) * i / 4
            svg.append(f'<line x1="60" x2="{60 + pw:.0f}" y1="{sy(v):.1f}" y2="{sy(v):.1f}" class="grid"/>'
                       f'<text x="54" y="{sy(v) + 4:.1f}" class="axis" text-anchor="end">{html.escape(fmt_value(v, unit))}</text>')
        for i in range(6):
            t = args.start + (args.end - args.start) * i / 5
            svg.append(f'<text x="{sx(t):.1f}" y="{ph + 26:.0f}" class="axis" text-anchor="middle">{int(t - args.start)} s</text>')
        rows = []
        # One colour per tenant (the legend's first word): its achieved/used line and its dashed
        # promised/quota line pair up.
        bases = []
        for name, _ in series:
            if name.split(" ")[0] not in bases:
                bases.append(name.split(" ")[0])
        for name, pts in series:
            color = COLORS[bases.index(name.split(" ")[0]) % len(COLORS)]
            dash = ' stroke-dasharray="8 6"' if any(d.match(name) for d in dashed) else ""
            good = [(t, v) for t, v in pts if not math.isnan(v)]
            if bars:
                bw = max(pw / max(len(pts), 1) * 0.8, 1)
                for t, v in good:
                    if v > 0:
                        svg.append(f'<rect x="{sx(t) - bw / 2:.1f}" y="{sy(v):.1f}" width="{bw:.1f}" height="{sy(lo) - sy(v):.1f}" fill="{color}"/>')
            elif good:
                path = " ".join(f"{sx(t):.1f},{sy(v):.1f}" for t, v in good)
                svg.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"{dash}/>')
            last = good[-1][1] if good else None
            peak = max((v for _, v in good), default=None)
            rows.append(f'<tr><td><span class="sw" style="background:{color}"></span>{html.escape(name)}</td>'
                        f'<td>{fmt_value(last, unit)}</td><td>{fmt_value(peak, unit)}</td></tr>')
        svg.append("</svg>")
        table = (f'<table class="legend" style="width:{legend_w}px"><tr><th></th><th>last</th><th>max</th></tr>'
                 + "".join(rows) + "</table>")
        return f'<div class="ts">{"".join(svg)}{table}</div>'

    return inner


def instant(p, args, uuid):
    results = []
    for t in p["targets"]:
        data = api(args.prometheus, "query", query=expand(t["expr"], uuid, args.rate_interval), time=args.end)
        for r in sorted(data["result"], key=lambda r: legend(t.get("legendFormat"), r["metric"])):
            results.append((legend(t.get("legendFormat"), r["metric"]), float(r["value"][1])))
    unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")

    def stat(w, h):
        v = results[0][1] if results else None
        color = threshold_color(p, v)
        bg = p.get("options", {}).get("colorMode") == "background"
        style = f"background:{color};color:#111" if bg else f"color:{color}"
        return f'<div class="stat" style="{style};height:{h:.0f}px">{html.escape(fmt_value(v, unit))}</div>'

    def bargauge(w, h):
        d = p["fieldConfig"]["defaults"]
        lo, hi = d.get("min", 0), d.get("max", 1)
        out = []
        for name, v in results:
            frac = max(0.0, min(1.0, (v - lo) / (hi - lo)))
            out.append(f'<div class="bg"><div class="bgname">{html.escape(name)}</div>'
                       f'<div class="bgbar"><div style="width:{frac * 100:.1f}%;background:{threshold_color(p, v)}"></div></div>'
                       f'<div class="bgval">{html.escape(fmt_value(v, unit))}</div></div>')
        return "".join(out)

    return stat if p["type"] == "stat" else bargauge


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prometheus", required=True)
    ap.add_argument("--start", type=float, required=True)
    ap.add_argument("--end", type=float, required=True)
    ap.add_argument("--dashboard", default="deploy/grafana/gpuslice.json")
    ap.add_argument("--rate-interval", default="4s")
    ap.add_argument("--step", default="1")
    args = ap.parse_args()
    dash = json.load(open(args.dashboard))
    uuids = api(args.prometheus, "label/UUID/values", **{"match[]": "gpuslice_memory_used_bytes"})
    # Panels before the first repeated row once; the row and the panels under it once per GPU.
    panels = dash["panels"]
    first_row = next((i for i, p in enumerate(panels) if p["type"] == "row" and p.get("repeat")), len(panels))
    body, y_offset = [], 0
    for p in panels[:first_row]:
        draw = instant(p, args, None) if p["type"] in ("stat", "bargauge") else timeseries(p, args, None)
        body.append(panel_box(p, 0, draw))
    repeated = panels[first_row:]
    height = max((p["gridPos"]["y"] + p["gridPos"]["h"] for p in repeated), default=0) - (repeated[0]["gridPos"]["y"] if repeated else 0)
    for n, uuid in enumerate(uuids):
        for p in repeated:
            q = dict(p, _uuid=uuid)
            if p["type"] == "row":
                g = p["gridPos"]
                y = (g["y"] + y_offset) * ROW_H + 70
                body.append(f'<div class="row" style="top:{y}px">GPU {html.escape(uuid)}</div>')
                continue
            draw = instant(q, args, uuid) if p["type"] in ("stat", "bargauge") else timeseries(q, args, uuid)
            body.append(panel_box(q, y_offset, draw))
        y_offset += height
    total_h = (max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels) + y_offset - height) * ROW_H + 90
    print(f"""<!doctype html><html><head><meta charset="utf-8"><style>
body {{ margin:0; background:#111217; color:#ccccdc; font:13px 'DejaVu Sans',sans-serif; width:1600px; height:{total_h}px; position:relative }}
.head {{ position:absolute; left:20px; top:14px; font-size:20px; color:#fff }}
.head small {{ font-size:12px; color:#8e8e9e; margin-left:16px }}
.panel {{ position:absolute; background:#181b1f; border:1px solid #2a2d33; border-radius:3px; overflow:hidden }}
.title {{ height:28px; line-height:28px; padding-left:10px; font-weight:bold; color:#d8d9da }}
.row {{ position:absolute; left:20px; font-size:15px; font-weight:bold; color:#fff }}
.ts {{ display:flex }} .grid {{ stroke:#2a2d33 }} .axis {{ fill:#8e8e9e; font-size:11px }}
.legend {{ font-size:12px; border-collapse:collapse; margin-top:4px; align-self:flex-start }}
.legend td, .legend th {{ padding:2px 6px; text-align:right; white-space:nowrap }} .legend td:first-child {{ text-align:left }}
.legend th {{ color:#8e8e9e; font-weight:normal }}
.sw {{ display:inline-block; width:12px; height:4px; margin-right:6px; vertical-align:middle }}
.stat {{ display:flex; align-items:center; justify-content:center; font-size:40px; font-weight:bold }}
.bg {{ display:flex; align-items:center; margin:10px 12px }} .bgname {{ width:90px }} .bgval {{ width:70px; text-align:right }}
.bgbar {{ flex:1; height:26px; background:#22252b }} .bgbar div {{ height:100% }}
</style></head><body><div class="head">{html.escape(dash['title'])}<small>{int(args.end - args.start)} s of real Prometheus data; panels drawn from the dashboard's own queries by scripts/render-dashboard.py (Grafana is not packaged for Debian)</small></div>
{''.join(body)}</body></html>""")


if __name__ == "__main__":
    main()
