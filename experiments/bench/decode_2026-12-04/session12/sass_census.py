#!/usr/bin/env python3
"""Static SASS census of one kernel, for sessions without a GPU: instructions per source line and the
loop bodies (ranges closed by a backward branch) with their main source lines.

    cuobjdump -xelf all build-dev/cuda/CMakeFiles/replayssm_cuda.dir/ssm/decode_replay_nonflush.cu.o
    nvdisasm -c -gi decode_replay_nonflush.sm_90.cubin > k.sass
    python3 sass_census.py k.sass 'replay_nonflush_kernel<\\(replayssm::ssm::Recurrence\\)0, .*StorageFormat\\)6, 128, false, true>' [TOP]

(cuobjdump and nvdisasm come with the CUDA toolkit, and with the triton wheel's backends/nvidia/bin.)
Static counts are not executed counts: a loop body runs as often as its trip count, and predicated-off
branches not at all. They show where code is and how large each piece is; Nsight Compute's source
counters on the GPU give the executed counts."""
import collections
import re
import subprocess
import sys

path, pattern = sys.argv[1], sys.argv[2]
top = int(sys.argv[3]) if len(sys.argv) > 3 else 40
lines = open(path).read().split('\n')
starts = [(i, re.search(r'\.text\.(\S+?),', l).group(1)) for i, l in enumerate(lines)
          if re.match(r'\s*\.section\s+\.text\.', l)]
names = subprocess.run(['c++filt'], input='\n'.join(n for _, n in starts), capture_output=True,
                       text=True).stdout.split('\n')
chosen = [k for k, d in enumerate(names) if re.search(pattern, d)]
if len(chosen) != 1:
    sys.exit(f'{len(chosen)} kernels match: ' + '; '.join(names[k] for k in chosen[:5]))
k = chosen[0]
body = lines[starts[k][0]:starts[k + 1][0] if k + 1 < len(starts) else len(lines)]
print(names[k])

# instructions with their inline chain (innermost source line first); nvdisasm -gi prints the chain only
# when it changes, so an instruction without one keeps the previous chain
insts, labels, pending_labels, group, chain = [], {}, [], [], ()
for l in body:
    s = l.strip()
    m = re.match(r'//## File "([^"]+)", line (\d+)', s)
    if m:
        group.append(f'{m.group(1).split("/")[-1]}:{m.group(2)}')
        continue
    m = re.match(r'(\.L_x_\d+):', s)
    if m:
        pending_labels.append(m.group(1))
        continue
    m = re.match(r'/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;', s)
    if m:
        if group:
            chain, group = tuple(group), []
        addr = int(m.group(1), 16)
        for p in pending_labels:
            labels[p] = addr
        pending_labels = []
        insts.append((addr, m.group(2), chain))
loops = []
for addr, text, _ in insts:
    m = re.search(r'BRA[^`]*`\((\.L_x_\d+)\)', text)
    if m and labels.get(m.group(1), addr + 1) <= addr:
        loops.append((labels[m.group(1)], addr))
print(f'{len(insts)} instructions, {len(loops)} loops')
per_line = collections.Counter(c[0] if c else '?' for _, _, c in insts)
for line, n in per_line.most_common(top):
    print(f'{n:6d}  {line}')
print('loops: address range, static instructions, main innermost lines')
for lo, hi in sorted(loops):
    inside = collections.Counter(c[0] if c else '?' for a, _, c in insts if lo <= a <= hi)
    print(f'  {lo:#07x}-{hi:#07x} {sum(inside.values()):5d}  ' + ', '.join(f'{l} {n}' for l, n in inside.most_common(3)))
