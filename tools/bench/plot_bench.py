#!/usr/bin/env python3
"""Plots kolo_bench's CSV: bus bandwidth (GB/s) against message size, one
panel per collective, one line per implementation (kolo and each baseline).

    plot_bench.py results.csv out.png [--title TEXT]

Read it like nccl-tests' busbw: higher is better; a line that flattens is at
the limit of its transport (for shared memory: memory bandwidth; for
loopback TCP: the kernel's copies); at small sizes the curves show latency.
"""
import argparse
import csv
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ORDER = ["allreduce", "allgather", "broadcast", "reducescatter", "alltoall"]
STYLE = {"kolo": ("tab:red", "o"), "gloo": ("tab:blue", "s"),
         "mpi": ("tab:green", "^"), "torch": ("tab:orange", "v")}


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("csv")
    p.add_argument("png")
    p.add_argument("--title", default="kolo_bench")
    args = p.parse_args()
    data = defaultdict(lambda: defaultdict(list))  # op -> impl -> [(bytes, busbw)]
    with open(args.csv) as f:
        for row in csv.DictReader(f):
            if row["op"] in ORDER:
                data[row["op"]][row["impl"]].append(
                    (int(row["bytes"]), float(row["busbw_gbs"])))
    ops = [op for op in ORDER if op in data]
    if not ops:
        raise SystemExit("no collective measurements in " + args.csv)
    fig, axes = plt.subplots(1, len(ops), figsize=(5 * len(ops), 4), squeeze=False)
    for ax, op in zip(axes[0], ops):
        for impl, points in sorted(data[op].items()):
            points.sort()
            color, marker = STYLE.get(impl, ("gray", "x"))
            ax.plot([b for b, _ in points], [bw for _, bw in points], label=impl,
                    color=color, marker=marker, markersize=4)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_title(op)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)


if __name__ == "__main__":
    main()
