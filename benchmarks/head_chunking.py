"""Benchmark: the trainer's LM-head statistics at a 150k-token vocabulary, chunked vs unchunked.

``rlparity.score.head_stats`` projects hidden states through the LM head ``chunk_tokens`` rows at a
time, so peak memory is ``chunk_tokens x vocab`` instead of ``tokens x vocab``. This measures peak
RSS and wall time of each setting in its own subprocess (same run, same machine) and reports the
ratios against the unchunked baseline. Not a test: run it by hand.

    python benchmarks/head_chunking.py --vocab 151936 --tokens 2048 --hidden 256
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def one(vocab: int, tokens: int, hidden: int, chunk: int, head_dtype: str) -> dict:
    import torch

    from rlparity.score import head_stats

    g = torch.Generator().manual_seed(0)
    h = torch.randn(tokens, hidden, generator=g)
    w = torch.randn(vocab, hidden, generator=g) / hidden ** 0.5
    tok = torch.randint(0, vocab, (tokens,), generator=g)
    temp = torch.full((tokens,), 0.7)
    topk = torch.full((tokens,), 50, dtype=torch.long)
    topp = torch.full((tokens,), 0.95)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    out = head_stats(h, w, None, tok, temp, topk, topp, head_dtype, chunk_tokens=chunk)
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"chunk_tokens": chunk, "wall_s": wall, "peak_rss_mb": peak / 1024, "extra_rss_mb": (peak - base) / 1024,
            "checksum": float(out["trainer_logprob"].sum() + out["trainer_log_kept_mass"].sum())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--chunks", type=int, nargs="+", default=[128, 512])
    ap.add_argument("--head-dtype", default="float32")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one is not None:
        print(json.dumps(one(a.vocab, a.tokens, a.hidden, a.one, a.head_dtype)))
        return
    rows = []
    for chunk in [a.tokens, *a.chunks]:  # baseline first: one chunk = unchunked
        res = subprocess.run([sys.executable, __file__, "--vocab", str(a.vocab), "--tokens", str(a.tokens),
                              "--hidden", str(a.hidden), "--head-dtype", a.head_dtype, "--one", str(chunk)],
                             capture_output=True, text=True, check=True)
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
    base = rows[0]
    for r in rows:
        r["extra_rss_vs_unchunked"] = r["extra_rss_mb"] / base["extra_rss_mb"]
        r["wall_vs_unchunked"] = r["wall_s"] / base["wall_s"]
        r["same_result"] = abs(r["checksum"] - base["checksum"]) <= 1e-6 * max(1.0, abs(base["checksum"]))
    print(json.dumps({"vocab": a.vocab, "tokens": a.tokens, "hidden": a.hidden, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
