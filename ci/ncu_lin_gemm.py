"""Driver for ncu of lin_gemm_kernel (TRIT_LIN_GEMM=1) beside tmm_kernel on one shape: three calls of each
(profile the third: `ncu -k regex:lin_gemm --launch-skip 2 -c 1`). Args: N K M [env KEY=VALUE ...]."""
import os
import sys

import torch

from trit import ops

N, K, M = (int(a) for a in sys.argv[1:4])
os.environ.update(dict(a.split("=", 1) for a in sys.argv[4:]))
w = torch.randint(-1, 2, (N, K), dtype=torch.int8, device="cuda")
p, s = ops.repack(w), torch.rand(N, device="cuda") + 0.5
x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
for lg in ("1", "0"):
    os.environ["TRIT_LIN_GEMM"] = lg
    for _ in range(3):
        torch.ops.trit.ternary_mm(x, p, s, N, K, None)
torch.cuda.synchronize()
print("driver done")
