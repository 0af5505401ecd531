#!/usr/bin/env bash
# Issue 24/25 GPU checks, one call: FP8 and AMP at batch 64 (never measured since the fixes), then FP8 at batch 8.
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
date -u; nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv; nproc; free -g | head -2
python3 -c "import torch,torchao,llmb; print(torch.__version__, torch.version.cuda, torchao.__version__, llmb.__file__)" 2>&1 | grep -v Warning
python3 -m llmb plugins 2>&1 | tail -5
snap() { tar czf $OUT/raw.tgz benchmarks/raw/fidelity-20261126* /tmp/rec 2>/dev/null; }
point() {  # path batch limit
  local left=$(( ${CAP:-560} - $(el) ))
  [ "$left" -lt "$3" ] && { echo "skip $1 b$2: ${left}s left"; return; }
  echo "== $1 b$2 at $(el)s"
  timeout "$left" python3 benchmarks/fidelity.py --device cuda --plugin cuda --preset official --precision BF16 \
    --steps 20 --warmup-steps 5 --rounds 1 --batch-sizes "$2" --paths "$1" --timeout 300 --settle 3 \
    --keep-records /tmp/rec 2>&1 | grep -v -i "warning\|^  \"\"\"\|quant_api"
  snap; echo "== done $1 b$2 at $(el)s"
}
[ -z "${ONLY:-}" ] && point fp8 64 150
[ -z "${ONLY:-}" ] && point amp 64 150
point fp8 8 150
point eager 8 100
snap; echo "total $(el)s"
