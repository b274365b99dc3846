"""How far ahead of a peer's ReplaySSM decode any kernel could be: the peer's time against the time the step's
bytes take at the copy bandwidth measured in the same run.

For each peer row (scripts/bench_peers.py CSV) the step moves at least the bytes our bench counts for the same
shape, B and L (its `replay fp32 (staggered windows)` row: state read once, records, inputs, outputs). A kernel
can take no less than bytes / copy bandwidth, so no kernel is more than peer_time / (bytes / copy) times faster
than the peer. Prints that bound beside our measured ratio.

    python3 peer_bounds.py RESULTS_DIR OUR_RECORD_GLOB [OUR_EXTRA_CSV ...]
    e.g. python3 peer_bounds.py call_pack24 'record_lib_e3_*.csv' ours_lib_land_b64_128.csv
Files may be .csv or .csv.xz.
"""
import collections
import csv
import glob
import lzma
import os
import sys


def rows(path):
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rt") as f:
        yield from csv.DictReader(f)


def main(folder, record_glob, *extra):
    ours = collections.defaultdict(list)  # (model, B) -> [(us, bytes, copy GB/s)]
    paths = glob.glob(os.path.join(folder, record_glob)) + glob.glob(os.path.join(folder, record_glob + ".xz"))
    for name in extra:
        paths += glob.glob(os.path.join(folder, name)) + glob.glob(os.path.join(folder, name + ".xz"))
    if not paths:
        sys.exit(f"peer_bounds.py: no files match {record_glob} in {folder}")
    for p in paths:
        for r in rows(p):
            if r["kernel"] == "replay fp32 (staggered windows)":
                ours[(r["model"], int(r["batch"]))].append(
                    (float(r["us_per_step"]), float(r["bytes_per_step"]), float(r["copy_gbps"])))
    print(f"{'model':20s} {'peer kernel':52s} {'B':>4s} {'peer us':>8s} {'% copy':>7s} {'bound':>6s} {'ours us':>8s} {'ours x':>7s}")
    for peer in ("peers_vllm.csv", "peers_flashinfer.csv"):
        hits = glob.glob(os.path.join(folder, peer)) + glob.glob(os.path.join(folder, peer + ".xz"))
        if not hits:
            continue
        for r in rows(hits[0]):
            if "staggered" not in r["kernel"]:
                continue
            key = (r["model"], int(r["batch"]))
            if key not in ours:
                continue
            us, nbytes, copy = min(ours[key])  # our fastest round; bytes and copy of that round
            peer_us = float(r["us_per_step"])
            floor_us = nbytes / (copy * 1e3)  # bytes / (GB/s) in microseconds
            print(f"{key[0]:20s} {r['kernel'][:52]:52s} {key[1]:4d} {peer_us:8.1f} {100 * floor_us / peer_us:6.1f}% "
                  f"{peer_us / floor_us:6.2f} {us:8.1f} {peer_us / us:7.2f}")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(*sys.argv[1:])
