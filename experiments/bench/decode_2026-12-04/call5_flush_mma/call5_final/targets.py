# targets_*.txt: per shape and B, conventional % of copy, staggered x, flush step (conv. steps), LP reads x,
# verify T = 8 without / with a flush (conv. steps). Usage: python3 targets.py "main_new_*.csv" (xz -d first).
import csv,glob,sys
pat=sys.argv[1] if len(sys.argv)>1 else 'main_new_*.csv'
d={}
for f in sorted(glob.glob(pat)):
    for r in csv.DictReader(open(f)):
        k=(r['model'],r['kernel'],r['batch'])
        if k not in d or float(r['us_per_step'])<float(d[k]['us_per_step']): d[k]=r
models=sorted({k[0] for k in d})
def us(m,kn,b): r=d.get((m,kn,str(b))); return float(r['us_per_step']) if r else float('nan')
print(f"{'model':20s} {'B':>4s} {'conv%':>6s} {'stag':>5s} {'flush':>6s} {'fp16':>5s} {'fp8':>5s} {'nvfp4':>5s} {'vNoF':>5s} {'vF':>5s}")
for m in models:
    for b in (32,256):
        c=us(m,'conventional fp32',b)
        r=d.get((m,'conventional fp32',str(b)))
        f32=None
        print(f"{m[:20]:20s} {b:4d} {float(r['pct_copy']) if r else 0:6.1f} {c/us(m,'replay fp32 (staggered windows)',b):5.2f} {us(m,'replay fp32 flush step',b)/c:6.2f} "
              f"{float(d[(m,'non-flush read fp16 (x over fp32 read)',str(b))]['speedup_vs_reference']):5.2f} "
              f"{float(d.get((m,'non-flush read fp8b128 (x over fp32 read)',str(b)),{'speedup_vs_reference':'nan'})['speedup_vs_reference']):5.2f} "
              f"{float(d[(m,'non-flush read nvfp4 (x over fp32 read)',str(b))]['speedup_vs_reference']):5.2f} "
              f"{us(m,'verify output-only (no flush)',b)/c:5.2f} {us(m,'verify output-only (with flush)',b)/c:5.2f}")
