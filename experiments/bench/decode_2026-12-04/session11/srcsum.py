# Per-source-line executed warp instructions of one kernel launch, from `ncu --page source --csv
# --print-source cuda,sass` (the device_call.sh of call1/call3 writes src_page_*.csv; too large to keep).
# Usage: python3 srcsum.py src_page.csv WARPS [TOP]   (WARPS: warps in the launch, e.g. 8192 blocks x 8)
import csv, collections, sys
def num(x):
    x = x.replace(',', '')
    return int(x) if x.isdigit() else 0
rows = list(csv.reader(open(sys.argv[1])))
warps = int(sys.argv[2]); top = int(sys.argv[3]) if len(sys.argv) > 3 else 30
cur = None; agg = collections.Counter(); smp = collections.Counter(); src = {}
for r in rows:
    if not r: continue
    if r[0] == 'File Path': cur = r[1].split('/')[-1]; continue
    if r[0] in ('Function Name', 'Line No') or not r[0]: continue  # line rows carry the line's totals
    k = (cur, int(r[0])); agg[k] += num(r[7]); smp[k] += num(r[4]); src[k] = r[1].strip()[:90]
T = sum(agg.values()); S = max(sum(smp.values()), 1)
print(f'{T / 1e6:.1f} M warp instructions, {T / warps:.0f} per warp, {S} stall samples')
byf = collections.Counter(); byfs = collections.Counter()
for k, n in agg.items(): byf[k[0]] += n; byfs[k[0]] += smp[k]
for f, n in byf.most_common(): print(f'  {f:32s} {n / warps:7.0f} per warp  {100 * byfs[f] / S:5.1f}% of samples')
for k, n in agg.most_common(top): print(f'{n / warps:7.1f}/warp smp {100 * smp[k] / S:4.1f}% {k[0]}:{k[1]} {src[k]}')
