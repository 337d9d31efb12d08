#!/usr/bin/env bash
# Device side: TRL's stack (trl, accelerate, datasets and their small deps) into /tmp/site, each wheel
# only where the GPU image lacks its distribution; pyarrow is part5 (55 MB), needed only if absent.
set -uo pipefail
d=$(cd "$(dirname "$0")" && pwd)
mkdir -p /tmp/site
for w in "$d"/whl/*.whl; do
  dist=$(basename "$w" | cut -d- -f1)
  if PYTHONPATH=/tmp/site python3 -c "import importlib.metadata as m,sys; m.version(sys.argv[1].replace('_','-'))" "$dist" 2>/dev/null; then
    echo "have $dist $(PYTHONPATH=/tmp/site python3 -c "import importlib.metadata as m,sys; print(m.version(sys.argv[1].replace('_','-')))" "$dist")"
  else
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$w" 2>&1 | grep -v WARNING
    echo "installed $(basename "$w")"
  fi
done
PYTHONPATH=/tmp/site python3 - <<'PY'
import importlib.metadata as m
for d in ("transformers", "torch", "huggingface-hub", "pandas", "pyarrow", "aiohttp", "requests", "jinja2", "psutil",
          "pyyaml", "safetensors", "tqdm", "filelock", "xarray", "typer", "pydantic", "accelerate", "datasets", "trl"):
    try:
        print(d, m.version(d))
    except Exception as e:
        print(d, "MISSING")
PY
touch /tmp/site/.rlparity-gpu-part4
