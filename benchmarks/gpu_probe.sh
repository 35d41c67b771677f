#!/usr/bin/env bash
# Diagnosis on the device: do tuned records reach the compiled ResNet-18? (tunekit vs stock engine)
set -uo pipefail
export PYTHONPATH=/root/site:$PWD CUDA_PATH=${CUDA_PATH:-/usr/local/cuda} PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled
OUT=${OUT:-/tmp/probe-out}; mkdir -p "$OUT"
python3 -m tunekit.cli example --name resnet18 --out /tmp/r18.onnx
for engine in tunekit stock; do
  extra=""; [ $engine = stock ] && extra="--engine stock --server-mode stock"
  timeout 260 python3 -m tunekit.cli tune /tmp/r18.onnx --gpu-pct 40 --trials ${TRIALS:-32} --trials-per-iter 16 \
    --out /tmp/r18-$engine --json $extra > "$OUT/r18-$engine.json" 2> "$OUT/r18-$engine.log"; echo "$engine rc=$?"
  python3 -c "
import json; r=json.load(open('$OUT/r18-$engine.json'))['report']; print('$engine e2e', r['latency_ms']['untuned']['median_ms'], r['latency_ms']['tuned']['median_ms'], r['tuning_wall_s'])
[print('  ', t['name'], t.get('untuned_us'), t.get('tuned_us'), t.get('record_applied')) for t in r['tasks'] if t.get('tuned_us')]"
  python3 benchmarks/artifact_probe.py /tmp/r18-$engine/untuned.so /tmp/r18-$engine/r18-gpu40.so 2>&1 | grep -v "^\[" | cut -c1-400
done
timeout 200 python3 -m tunekit.cli evaluate /tmp/r18.onnx --records /tmp/r18-tunekit --gpu-pct 40,100 --repeats 20 2>&1 | tail -4
timeout 200 python3 -m tunekit.cli evaluate /tmp/r18.onnx --records /tmp/r18-stock --gpu-pct 40 --repeats 20 2>&1 | tail -3
