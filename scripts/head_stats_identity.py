"""head_stats and head_stats_reference of two checkouts on the same inputs, compared bitwise
(top-k, top-p, both, greedy rows, 200 tied logits that run past the top-k window; float32 and
bfloat16 heads, eager):

    python scripts/head_stats_identity.py CHECKOUT_A CHECKOUT_B
"""
import importlib.util
import sys
from pathlib import Path

import numpy as np
import torch

def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); return m

def module_file(root):  # rlparity/score/head.py before issue 23 renamed it lm_head_stats.py
    new = Path(root) / "rlparity/score/lm_head_stats.py"
    return new if new.exists() else Path(root) / "rlparity/score/head.py"


a = load(module_file(sys.argv[1]), "head_a")
b = load(module_file(sys.argv[2]), "head_b")
g = torch.Generator().manual_seed(0)
n, h, v = 96, 16, 300
hidden = torch.randn(n, h, generator=g)
w = torch.randn(v, h, generator=g)
w[:200] = w[0]  # 200 tied logits, the largest of every row: ties past the window
bias = torch.zeros(v); bias[:200] = 50.0
tok = torch.randint(0, v, (n,), generator=g)
tok[::5] = 0
temp = torch.tensor([0.7, 1.0, 1.3, 0.0] * (n // 4))
topk = torch.tensor([0, 5, 20, 1, 50, 0] * (n // 6))
topp = torch.tensor([1.0, 0.9, 0.5, 1.0] * (n // 4))
for dt in ("float32", "bfloat16"):
    for comp in (False,):
        ra = a.head_stats(hidden, w, bias, tok, temp, topk, topp, dt, chunk_tokens=32, compile=comp)
        rb = b.head_stats(hidden, w, bias, tok, temp, topk, topp, dt, chunk_tokens=32, compile=comp)
        for k in ra:
            assert np.array_equal(ra[k], rb[k], equal_nan=True), (dt, k)
        print(dt, "identical:", sorted(ra))
for dt in ("float32", "bfloat16"):
    ra = a.head_stats_reference(hidden, w, bias, tok, temp, topk, topp, dt)
    rb = b.head_stats_reference(hidden, w, bias, tok, temp, topk, topp, dt)
    for k in ra:
        assert np.array_equal(ra[k], rb[k], equal_nan=True), (dt, k)
    print(dt, "reference identical")
