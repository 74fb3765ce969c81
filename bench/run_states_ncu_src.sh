set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
B=/tmp/bn
[ -d $B ] || meson setup $B . -Dgpu_arch=90 -Dpython=disabled -Dprofiler=false >/dev/null
ninja -C $B bench/qk-bench >$OUT/build.log 2>&1; echo "build rc $?"
timeout 300 ncu --kernel-name regex:"qk__k_pass_wht" --launch-count 1 --section SourceCounters --section InstructionStats \
   --page source --print-source sass --csv $B/bench/qk-bench --cases zz16 --reps 1 > $OUT/src.csv 2>$OUT/ncu.err; echo "ncu rc $?"
head -3 $OUT/src.csv | cut -c1-600
python3 - $OUT/src.csv <<'PY' > $OUT/top.txt
import csv,sys,re
rows=list(csv.reader(open(sys.argv[1])))
hdr=None
for i,r in enumerate(rows):
    if any('Source' in c for c in r) and any('Instructions Executed' in c or 'inst_executed' in c for c in r): hdr=i;break
if hdr is None:
    print("no header; first rows:"); [print(r[:8]) for r in rows[:5]]; sys.exit()
h=rows[hdr]; print(h)
si=[j for j,c in enumerate(h) if c=='Source'][0]
ei=[j for j,c in enumerate(h) if 'Instructions Executed' in c or c=='inst_executed'][0]
data=[]
for r in rows[hdr+1:]:
    if len(r)<=max(si,ei): continue
    try: n=float(r[ei].replace(',',''))
    except: continue
    data.append((n,r[si],r[0]))
tot=sum(d[0] for d in data); print("total",tot, "lines", len(data))
# opcode histogram
from collections import Counter
c=Counter()
for n,s,a in data: c[re.split(r'[ .]', s.strip().lstrip('@!PUT0123456789 ').strip())[0]]+=n
for k,v in c.most_common(25): print("%-10s %5.1f%%"%(k,100*v/tot))
# contiguous hot regions: print lines with running index
for idx,(n,s,a) in enumerate(data):
    if n>=tot/400: print(idx, int(n), a, s)
PY
wc -l $OUT/top.txt; head -150 $OUT/top.txt
