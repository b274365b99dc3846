# ab_summary.txt from main_{new,old}_*.csv (xz -d them first): old us, new us, new/old, min over rounds.
# Usage: python3 ab.py [kernel regex]
import csv,sys,re,glob,collections
pat=sys.argv[1] if len(sys.argv)>1 else '.'
d={}
for v in ('new','old'):
    for f in sorted(glob.glob(f'main_{v}_*.csv')):
        for r in csv.DictReader(open(f)):
            k=(v,r['model'],r['kernel'],r['batch'],r['param'])
            d[k]=min(d.get(k,1e30),float(r['us_per_step']))
keys=sorted({k[1:] for k in d})
for k in keys:
    if not re.search(pat,k[1]): continue
    n,o=d.get(('new',)+k),d.get(('old',)+k)
    if n and o: print(f"{k[0][:18]:18s} {k[1][:44]:44s} {k[2]:>4s} {k[3]:>3s} {o:9.1f} {n:9.1f} {n/o:6.3f}")
