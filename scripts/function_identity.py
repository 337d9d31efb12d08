"""Refactor identity of single functions the shipped examples do not reach, between two checkouts:
``train_step`` (a tiny model on CPU), ``synthetic_trace`` and ``ablation`` (a stand-in pool, engines and
scorer: no vLLM engine starts). Each check runs in a child process per checkout (its own
``PYTHONPATH``) and the results are compared exactly (NaN equal to NaN; dates left out)::

    python scripts/function_identity.py CHECKOUT_A CHECKOUT_B [train_step synthetic_trace ablation]

Issue 35 used it to show its splits of these functions changed no result.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

SKIP = {"created_at", "seconds"}


def check_train_step(trace_file: Path) -> dict:
    import torch

    from rlparity.models import make_model, make_prompts
    from rlparity.score import score
    from rlparity.train import generate_trace, train_step

    model = str(make_model("tiny", progress=False))
    if trace_file.exists():  # the same sampled trace for both checkouts
        trace = pickle.loads(trace_file.read_bytes())
    else:
        trace = score(generate_trace(model, make_prompts(4, seed=3), n=4, max_new_tokens=12, seed=0), model,
                      progress=False)
        trace_file.write_bytes(pickle.dumps(trace))
    rng = np.random.default_rng(0)
    n, w = trace.sizes["sequence"], trace.sizes["position"]
    mask = trace["response_mask"].values.astype(bool)
    keep = mask & (rng.uniform(size=(n, w)) > 0.2)
    weights = np.where(keep, rng.uniform(0.5, 1.5, size=(n, w)), np.nan)
    cases = {"gspo": dict(loss="gspo", lr=1e-4),
             "ppo": dict(loss="ppo", lr=3e-3, return_gradient=True, max_grad_norm=0.5),
             "grpo": dict(loss="grpo", lr=1e-3, keep=keep, token_weights=weights),
             "ppo_mu": dict(loss="ppo", lr=1e-3, old_logprob=trace["rollout_logprob"].values, trainer="raw"),
             "nostep": dict(loss="ppo", lr=1e-3, step=False, return_gradient=True)}
    out = {}
    for name, kw in cases.items():
        torch.manual_seed(0)
        r = train_step(model, trace, rewards=[float(i % 2) for i in range(n)], **kw)
        out[name] = (r.metrics, r.trace, r.gradient)
    return out


def check_synthetic_trace(_: Path) -> dict:
    from rlparity.testing import synthetic_trace

    cases = [{}, dict(n_sequences=5, max_len=9, vocab=17, top_k=5, seed=3), dict(top_p=0.8, noise=0.1, seed=1),
             dict(top_k=8, top_p=0.9, head_noise=0.3, trainer_noise=0.2, logprobs_mode="raw_logprobs", seed=7),
             dict(scored=False, seed=2, arm="x"), dict(n_sequences=3, max_len=1, temperature=1.3)]
    return {i: synthetic_trace(**kw) for i, kw in enumerate(cases)}


def check_ablation(_: Path) -> dict:
    from rlparity.config.settings import SamplingSettings
    from rlparity.experiments import ablation as A
    from rlparity.testing import synthetic_trace

    class Engine:
        def __init__(self, settings, log):
            self.settings, self.log = settings, log

        def capture(self, prompts, sampling, arm="default", progress=False):
            self.log.append(("capture", arm, len(prompts), sampling.max_tokens))
            tr = synthetic_trace(n_sequences=len(prompts), max_len=6, seed=len(self.log), arm=arm, scored=False)
            eff = {k: v for k, v in self.settings.model_dump(mode="json").items() if v is not None}
            tr.attrs["engine_effective"] = {**tr.attrs["engine_effective"], **eff}
            return tr

    class Pool:
        def __init__(self, fail=()):
            self.log, self.fail = [], fail

        def get(self, model, settings):
            self.log.append(("get", model))
            if any(getattr(settings, f, None) == v for f, v in self.fail):
                raise RuntimeError("the stand-in engine refuses this setting")
            return Engine(settings, self.log)

        def close(self):
            self.log.append(("close",))

    class Scorer:
        def score(self, tr):
            return tr

    def run(fail=(), **kw):
        pool = Pool(fail)
        arms = A.ablation("stand-in-model", ["p1", "p2", "p3"], SamplingSettings(temperature=0.7, max_tokens=6),
                          scorer=Scorer(), pool=pool, **kw)
        return arms, pool.log

    knobs = list(A.DEFAULT_KNOBS)
    out = {"all": run(batch=None, engine={"dtype": "float32"}),
           "refused": run(batch=None, knobs=knobs[:4] + ["max_num_seqs"], fail=[("attention_backend", "FLEX_ATTENTION")]),
           "budget": run(batch=None, budget_s=0.0, warmup=False),
           "probe": run(batch=A.BatchProbe(sizes=(1, 2), max_tokens=4), knobs=[A.Knob("mine", "max_num_seqs", 3)])}
    try:
        A.ablation("m", ["p"], knobs=["nope"], scorer=Scorer(), pool=Pool())
    except ValueError as err:
        out["unknown"] = str(err)
    return out


CHECKS = {"train_step": check_train_step, "synthetic_trace": check_synthetic_trace, "ablation": check_ablation}


def same(a, b, where="") -> list[str]:
    """Where ``a`` and ``b`` differ (exactly; NaN equals NaN; :data:`SKIP` keys left out)."""
    import xarray as xr

    if isinstance(a, xr.Dataset) and isinstance(b, xr.Dataset):
        a, b = a.copy(), b.copy()
        for d in (a, b):
            for k in SKIP:
                d.attrs.pop(k, None)
        diff = [] if a.identical(b) else [f"{where}: datasets differ"]
        return diff + [f"{where}.{v}: dtype" for v in a.variables if v in b.variables and a[v].dtype != b[v].dtype] \
            + same(dict(a.attrs), dict(b.attrs), f"{where}.attrs")
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        ok = isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype and \
            np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")
        return [] if ok else [f"{where}: arrays differ"]
    if isinstance(a, dict) and isinstance(b, dict):
        keys = [k for k in {**a, **b} if k not in SKIP]
        return [f"{where}.{k}: only on one side" for k in keys if (k in a) != (k in b)] + \
            [d for k in keys if k in a and k in b for d in same(a[k], b[k], f"{where}.{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b) or type(a) is not type(b):
            return [f"{where}: lengths or types differ"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in same(x, y, f"{where}[{i}]")]
    if isinstance(a, float) and isinstance(b, float) and np.isnan(a) and np.isnan(b):
        return []
    return [] if type(a) is type(b) and a == b else [f"{where}: {a!r} != {b!r}"]


def main() -> None:
    if sys.argv[1] == "--child":  # python function_identity.py --child CHECK OUT SHARED
        result = CHECKS[sys.argv[2]](Path(sys.argv[4]))
        Path(sys.argv[3]).write_bytes(pickle.dumps(result))
        return
    a, b, names = sys.argv[1], sys.argv[2], sys.argv[3:] or list(CHECKS)
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            results = []
            for i, root in enumerate((a, b)):
                out = Path(tmp) / f"{name}-{i}.pkl"
                env = {**os.environ, "PYTHONPATH": str(Path(root).resolve()), "HF_HUB_OFFLINE": "1"}
                subprocess.run([sys.executable, __file__, "--child", name, str(out), str(Path(tmp) / "trace.pkl")],
                               env=env, check=True, cwd=tmp, stdout=subprocess.DEVNULL)
                results.append(pickle.loads(out.read_bytes()))
            diff = same(*results, where=name)
            bad += len(diff)
            print(f"{name}: {'identical' if not diff else f'{len(diff)} differences'}", *diff[:10], sep="\n  ")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
