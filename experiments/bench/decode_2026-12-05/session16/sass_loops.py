# Loops of the SASS functions whose name matches argv[1] (a regex), found by their backward branches: each
# loop's address range, instruction count and its most frequent opcodes. Usage (CUDA toolkit's cuobjdump):
#   cuobjdump -sass libreplayssm_cuda.so | python3 sass_loops.py 'kda_flush_kernel.*E0ELi128'
import sys,re,collections
pat=sys.argv[1]
funcs={}; name=None
for line in sys.stdin:
    m=re.match(r"\s*Function : (\S+)",line)
    if m: name=m.group(1); funcs[name]=[]; continue
    if name is None: continue
    m=re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);",line)
    if m: funcs[name].append((int(m.group(1),16),m.group(2)))
for n,ins in funcs.items():
    if not re.search(pat,n): continue
    print("==",n[-110:], "instr",len(ins))
    for i,(a,t) in enumerate(ins):
        m=re.search(r"BRA .*?0x([0-9a-f]+)",t)
        if not m: continue
        tgt=int(m.group(1),16)
        if tgt>=a: continue
        body=[x for b,x in ins if tgt<=b<=a]
        ops=collections.Counter(re.sub(r"^@!?U?P\w+\s+","",x).split()[0] for x in body)
        top=", ".join(f"{k} {v}" for k,v in ops.most_common(8))
        print("  loop",hex(tgt),"-",hex(a),"n",len(body),"|",top)
