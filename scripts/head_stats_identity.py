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
    """The module file ``path``, or the package folder ``path`` as a package of its own (its modules
    import each other relatively)."""
    path = Path(path)
    if path.is_dir():
        spec = importlib.util.spec_from_file_location(name, path / "__init__.py", submodule_search_locations=[str(path)])
    else:
        spec = importlib.util.spec_from_file_location(name, path)
    m = importlib.util.module_from_spec(spec); sys.modules[name] = m; spec.loader.exec_module(m); return m

def module_file(root):  # rlparity/score/head.py before issue 23 renamed it lm_head_stats.py, a package since issue 35
    for rel in ("rlparity/score/lm_head_stats", "rlparity/score/lm_head_stats.py", "rlparity/score/head.py"):
        if (Path(root) / rel).exists():
            return Path(root) / rel


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
