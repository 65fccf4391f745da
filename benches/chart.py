#!/usr/bin/env python3
"""The launch-overhead results as a table and as one picture: Atlas against the raw driver.

    python3 benches/chart.py extract CRITERION_DIR --label "2 x H200, driver 580.159.04, 2026-11-30"
        reads CRITERION_DIR/<group>/<bench>/new/estimates.json (criterion's output:
        target/criterion, or $CRITERION_HOME when set) and writes benches/results.tsv: one row
        per bench, the median in nanoseconds, or for the paired groups (`*_paired`) the median
        ratio to raw.
    python3 benches/chart.py render
        reads benches/results.tsv and writes benches/chart.svg.

`-o FILE` writes elsewhere; `render` takes another TSV as its argument. Standard library only.
"""

import argparse
import datetime
import html
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TSV = os.path.join(HERE, "results.tsv")
SVG = os.path.join(HERE, "chart.svg")
COLUMNS = ["group", "bench", "median_ns", "ratio"]

# Groups in the order the bench runs them (benches/launch_overhead/main.rs); others go last.
GROUP_ORDER = [
    "enqueue", "enqueue_paired", "roundtrip", "lookup", "replaced", "model_load",
    "model_load_paired", "graph_replay", "load_all_devices", "load_all_devices_paired",
]


def extract(criterion_dir, label):
    """Rows (group, bench, median_ns, ratio) from criterion's estimates under `criterion_dir`."""
    rows = []
    for root, _dirs, files in os.walk(criterion_dir):
        if os.path.basename(root) != "new" or "estimates.json" not in files:
            continue
        parts = os.path.relpath(os.path.dirname(root), criterion_dir).split(os.sep)
        if len(parts) < 2:
            continue
        group, bench = parts[0], "/".join(parts[1:])
        with open(os.path.join(root, "estimates.json")) as f:
            median = json.load(f)["median"]["point_estimate"]
        if group.endswith("_paired"):
            rows.append((group, bench, "", f"{median:.4f}"))
        else:
            rows.append((group, bench, f"{median:.0f}" if median >= 100 else f"{median:.3f}", ""))
    if not rows:
        sys.exit(f"chart.py: no <group>/<bench>/new/estimates.json under {criterion_dir}")
    order = {g: i for i, g in enumerate(GROUP_ORDER)}
    rows.sort(key=lambda r: (order.get(r[0], len(order)), r[0], r[1]))
    today = datetime.date.today().isoformat()
    header = [
        f"# source: {label}",
        f"# criterion medians from {os.path.abspath(criterion_dir)}, extracted {today} by benches/chart.py",
    ]
    return header, rows


def write_tsv(path, header, rows):
    with open(path, "w") as f:
        for line in header:
            f.write(line + "\n")
        f.write("\t".join(COLUMNS) + "\n")
        for row in rows:
            f.write("\t".join(row) + "\n")


def read_tsv(path):
    """The `# source:` line and {(group, bench): (median_ns or None, ratio or None)}."""
    source, values = "", {}
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("# source:"):
                source = line[len("# source:"):].strip()
            if not line or line.startswith("#") or line.split("\t")[:2] == COLUMNS[:2]:
                continue
            group, bench, median_ns, ratio = (line.split("\t") + ["", "", "", ""])[:4]
            values[(group, bench)] = (
                float(median_ns) if median_ns else None,
                float(ratio) if ratio else None,
            )
    return source, values


def duration(ns):
    for unit, scale in (("ms", 1e6), ("µs", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.3g} ns"


def chart_rows(values):
    """The picture's sections: (title, [(label, atlas / raw, note)]), skipping missing benches."""
    def ratio(group, bench):
        return values.get((group, bench), (None, None))[1]

    def time(group, bench):
        return values.get((group, bench), (None, None))[0]

    same = []
    control = ratio("enqueue_paired", "noop/raw")
    if control is not None:
        same.append(("control: raw ÷ raw, noop launch", control, f"×{control:.3f}"))
    for kernel, what in (("noop", "noop"), ("scale", "scale (3 args)"),
                         ("block_sum_96k", "block_sum (96 KiB smem)")):
        for variant, path in (("atlas_raw", "launch_on_stream"), ("atlas_typed", "typed launch")):
            r = ratio("enqueue_paired", f"{kernel}/{variant}")
            if r is not None:
                same.append((f"{what}: {path}", r, f"×{r:.3f}"))
    for blob, what in (("ptx", "PTX"), ("cubin", "cubin")):
        r = ratio("model_load_paired", f"demo_{blob}/atlas")
        if r is not None:
            same.append((f"model load, 4 {what} modules", r, f"×{r:.3f}"))

    skip = []
    for label, group, bench, raw_bench, atlas_bench in (
        ("lookup: cache ÷ cuModuleGetFunction", "lookup", "scale", "raw", "function_cache_get"),
        ("launch + sync: cached ÷ load per call", "replaced", "noop", "raw_load_per_call",
         "atlas_cached"),
        ("256 kernels: graph replay ÷ eager", "graph_replay", "noop256", "eager", "replay"),
    ):
        raw, atlas = time(group, f"{bench}/{raw_bench}"), time(group, f"{bench}/{atlas_bench}")
        if raw and atlas:
            times = raw / atlas
            times = f"{times:.0f}" if times >= 10 else f"{times:.1f}"
            skip.append((label, atlas / raw,
                         f"{duration(atlas)} against {duration(raw)} ({times}× less)"))
    for (group, bench), (_, r) in sorted(values.items()):
        if group == "load_all_devices_paired" and bench.endswith("/one_library") and r is not None:
            gpus = bench.split("/")[0].replace("_gpus", "")
            gpus = "1 GPU" if gpus == "1" else f"{gpus} GPUs"
            skip.append((f"{gpus}: one library ÷ load per device", r, f"×{r:.3f}"))
    return [
        ("Same work: Atlas time ÷ raw driver time (paired medians)", same),
        ("Work Atlas saves: Atlas time ÷ the way named after ÷", skip),
    ]


def render(source, sections):
    """A horizontal bar chart: raw = 1 as a grey bar, Atlas as a blue bar of its ratio."""
    # No font metrics here: about 6.8 px per character of 12 px sans-serif, rounded up.
    longest = max(len(label) for _, rows in sections for label, _, _ in rows)
    longest_note = max(len(note) for _, rows in sections for _, _, note in rows)
    label_w, bar_w, note_w = 20 + 7 * longest, 330, 20 + 7 * longest_note
    row_h, title_h, gap = 22, 26, 14
    scale_max = 1.1
    width = label_w + bar_w + note_w + 20
    x0 = label_w + 10
    y = 56
    body = []

    def px(value):
        return x0 + bar_w * min(value, scale_max) / scale_max

    for title, rows in sections:
        if not rows:
            continue
        body.append(f'<text x="10" y="{y + 17}" class="title">{html.escape(title)}</text>')
        y += title_h
        top = y
        for label, value, note in rows:
            mid = y + row_h / 2
            body.append(f'<text x="{label_w}" y="{mid + 4}" text-anchor="end">{html.escape(label)}</text>')
            body.append(f'<rect x="{x0}" y="{y + 3}" width="{px(1) - x0:.1f}" height="{row_h - 6}" class="raw"/>')
            body.append(f'<rect x="{x0}" y="{y + 6}" width="{max(px(value) - x0, 1):.1f}" height="{row_h - 12}" class="atlas"/>')
            body.append(f'<text x="{px(max(value, 1)) + 6:.1f}" y="{mid + 4}">{html.escape(note)}</text>')
            y += row_h
        body.append(f'<line x1="{px(1):.1f}" y1="{top - 2}" x2="{px(1):.1f}" y2="{y + 2}" class="one"/>')
        y += gap

    axis_y = y
    for tick in (0, 0.25, 0.5, 0.75, 1.0):
        body.append(f'<text x="{px(tick):.1f}" y="{axis_y + 8}" text-anchor="middle" class="small">{tick:g}</text>')
    legend_y = axis_y + 28
    body.append(f'<rect x="{x0}" y="{legend_y - 10}" width="14" height="12" class="raw"/>')
    body.append(f'<text x="{x0 + 20}" y="{legend_y}" class="small">raw driver, or the way after ÷ (= 1)</text>')
    body.append(f'<rect x="{x0 + 230}" y="{legend_y - 8}" width="14" height="8" class="atlas"/>')
    body.append(f'<text x="{x0 + 250}" y="{legend_y}" class="small">Atlas (shorter is cheaper)</text>')
    height = legend_y + 14

    head = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="Helvetica, Arial, sans-serif" font-size="12">',
        "<style>text{fill:#222}.title{font-weight:bold;font-size:13px}.small{font-size:11px;fill:#555}"
        ".raw{fill:#d4d4d4}.atlas{fill:#2f6db5}.one{stroke:#888;stroke-dasharray:3 3}</style>",
        f'<rect width="{width}" height="{height}" fill="#fff"/>',
        '<text x="10" y="22" font-size="15" font-weight="bold">Atlas against the raw CUDA driver</text>',
        f'<text x="10" y="40" class="small">{html.escape(source)}</text>',
    ]
    return "\n".join(head + body + ["</svg>"]) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("extract", help="criterion output directory -> results.tsv")
    ex.add_argument("criterion_dir")
    ex.add_argument("--label", required=True, help="machine, driver and date of the run")
    ex.add_argument("-o", "--output", default=TSV)
    re_ = sub.add_parser("render", help="results.tsv -> chart.svg")
    re_.add_argument("tsv", nargs="?", default=TSV)
    re_.add_argument("-o", "--output", default=SVG)
    args = parser.parse_args()
    if args.command == "extract":
        header, rows = extract(args.criterion_dir, args.label)
        write_tsv(args.output, header, rows)
        print(f"chart.py: wrote {len(rows)} rows to {args.output}")
    else:
        source, values = read_tsv(args.tsv)
        sections = chart_rows(values)
        if not any(rows for _, rows in sections):
            sys.exit(f"chart.py: {args.tsv} has none of the benches the chart shows")
        with open(args.output, "w") as f:
            f.write(render(source, sections))
        print(f"chart.py: wrote {args.output}")


if __name__ == "__main__":
    main()
