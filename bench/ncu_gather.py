"""One layer's gather (e8kv.CudaCache.gather, 32K positions, 8 KV heads x 128, bf16 out) on its own, for a
profiler: ncu --kernel-name regex:gather -s 2 -c 1 --section SpeedOfLight python3 bench/ncu_gather.py [spec]
(BENCHMARKS.md, "Chunks after a past"). Needs a GPU and libe8kv built with nvcc (E8KV_LIB)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
import torch  # noqa: E402

import e8kv  # noqa: E402

spec = sys.argv[1] if len(sys.argv) > 1 else "e8box:4"
L, H, D = 32768, 8, 128
c = e8kv.CudaCache(1, H, D, L // 16, spec, block_size=16, max_ctx=L, max_batch=1, max_n_head=32, max_seqs=1)
k = torch.randn(L, H * D, device="cuda", dtype=torch.bfloat16)
rows = torch.zeros(L, dtype=torch.int32, device="cuda")
if c.centered:
    c.set_means(0, 0, k, k)
c.append(0, torch.arange(L, device="cuda"), k, k, rows=rows if c.centered else None)
tables = torch.arange(L // 16, dtype=torch.int32, device="cuda").view(1, -1)
for _ in range(3):
    c.gather(0, L, tables, rows=rows[:1], dtype=torch.bfloat16)
torch.cuda.synchronize()
print("ok")
