# ab_summary.txt from main_{new,old}_*.csv[.xz]: old us, new us, new/old, min over rounds.
# Usage: python3 ab.py [kernel regex]   (in the folder of the CSVs; rows read by ../../../bench_csv.py,
# which mends the rows whose kernel label holds a comma, written bare by the bench before 2026-12-05)
import sys,re,glob,pathlib
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))
from bench_csv import read_bench_csv
pat=sys.argv[1] if len(sys.argv)>1 else '.'
d={}
for v in ('new','old'):
    files=sorted(glob.glob(f'main_{v}_*.csv')) or sorted(glob.glob(f'main_{v}_*.csv.xz'))
    for f in files:
        for r in read_bench_csv(f):
            k=(v,r['model'],r['kernel'],r['batch'],r['param'])
            d[k]=min(d.get(k,1e30),float(r['us_per_step']))
keys=sorted({k[1:] for k in d})
for k in keys:
    if not re.search(pat,k[1]): continue
    n,o=d.get(('new',)+k),d.get(('old',)+k)
    if n and o: print(f"{k[0][:18]:18s} {k[1][:44]:44s} {k[2]:>4s} {k[3]:>3s} {o:9.1f} {n:9.1f} {n/o:6.3f}")
