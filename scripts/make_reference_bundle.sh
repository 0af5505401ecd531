#!/usr/bin/env bash
# Remake the reference CPU bundle, submissions/llmb/cpu-reference: the cpu plugin, FP32, FP16 and BF16, 3 runs each.
# The tiny preset, not the official shape (FP32 AdamW there needs ~23 GB and tens of seconds a step on a 2-core
# CPU), so it is a debug bundle (--allow-debug-shapes) that verifies with --accept-debug. Tiny, not small: on a CPU
# without native 16-bit matmuls (AVX2 only) a small-preset FP16 run took ~10 minutes, and CI replays the bundle.
# The llmb tree must match llmb/release_manifest.json (else: python -m llmb.bundle.manifest --write, if that is the release).
# PRESET, STEPS, WARMUP, OUT and NAME override the defaults (e.g. a quick dry run: PRESET=tiny OUT=/tmp/subs).
set -euo pipefail
cd "$(dirname "$0")/.."
# RESULTS=DIR packages the runs and conformance records already in DIR instead of making them; the bundle itself
# will do (RESULTS=submissions/llmb/cpu-reference repackages its own runs, e.g. against a new release manifest).
PRESET=${PRESET:-tiny} STEPS=${STEPS:-3} WARMUP=${WARMUP:-1} OUT=${OUT:-submissions} NAME=${NAME:-cpu-reference}
python -m llmb.bundle.manifest
results=${RESULTS:-}
if [ -z "$results" ]; then
    results=$(mktemp -d)
    trap 'rm -rf "$results"' EXIT
    for precision in FP32 FP16 BF16; do
        for run in 1 2 3; do
            llmb run --plugin cpu --device cpu --preset "$PRESET" --precision "$precision" --steps "$STEPS" \
                --warmup-steps "$WARMUP" --out "$results"
        done
        llmb check-plugin --plugin cpu --device cpu --precision "$precision" --out "$results/conformance-$precision.json"
    done
else
    # Repackaging: the note describes the runs that are there, not this script's defaults.
    # ... and the processor they ran on, not the one repackaging them.
    read -r PRESET STEPS PROCESSOR < <(python -c '
import json, pathlib, sys
record = next(json.loads(p.read_text()) for p in sorted(pathlib.Path(sys.argv[1]).rglob("*.json"))
              if "tokens_per_second" in p.read_text())
print(record["preset"], record["steps"], json.dumps(record["device"]["name"]))' "$results")
fi
NOTE=${NOTE:-"Reference bundle: the $PRESET preset on the host CPU, $STEPS measured steps per run. Not the official shape: at the official shape FP32 AdamW needs about 23 GB and a step takes tens of seconds on this 2-core CPU."}
system_file=$(mktemp)
processor_field=""
[ -n "${PROCESSOR:-}" ] && processor_field="\"host_processor_model_name\": $PROCESSOR,"
cat > "$system_file" <<JSON
{"status": "reference (not a product)", "accelerator_interconnect": "N/A", "cooling": "N/A",
 $processor_field
 "hw_notes": "${HW_NOTES:-the machine the reference bundle was made on}"}
JSON
llmb package-submission --submitter llmb --system "$NAME" --results "$results" --out "$OUT" \
    --allow-debug-shapes --force --system-file "$system_file" --note "$NOTE"
rm -f "$system_file"
llmb verify "$OUT/llmb/$NAME" --accept-debug
