#!/usr/bin/env bash
# benchmarks/vs_pytorch.py on the device, across calls of <= 10 minutes (the machine keeps /tmp while
# it is held; the tuning run goes on in the background between calls). Results: /tmp/vsres, copied
# to $OUT after every call (commit them under benchmarks/results/h100-vs-pytorch/).
#   bash benchmarks/vs_session.sh start resnet18,bert resnet18   # baselines, then tune resnet18 (background)
#   bash benchmarks/vs_session.sh wait 540                       # let it tune; print progress
#   bash benchmarks/vs_session.sh finish                         # wait for the tune, bench its artifact
# VS_FLAGS: more vs_pytorch.py flags (e.g. --variants graphs-fp16); SEED: see below.
set -uo pipefail
export PYTHONPATH=/root/site:$PWD CUDA_PATH=${CUDA_PATH:-/usr/local/cuda} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/vs-out}; R=/tmp/vsres; W=/tmp/vs; mkdir -p "$OUT" "$R" "$W"
VS="python3 benchmarks/vs_pytorch.py --work $W --results $R --pcts ${PCTS:-40,100} ${VS_FLAGS:-}"
copy() { cp "$R"/* "$OUT"/ 2>/dev/null; cp /tmp/vs-tune.log "$OUT"/ 2>/dev/null; true; }
# A fresh machine starts from the committed results (SEED, a results dir; none: measure everything
# again, e.g. after a change to the compiled models): steps already measured are not measured again.
SEED=${SEED:-benchmarks/results/h100-vs-pytorch}
[ -f "$R/vs_pytorch.json" ] || cp "$SEED/vs_pytorch.json" "$R/" 2>/dev/null
trap copy EXIT
case "$1" in
  start)
    $VS export --models "$2${3:+,$3}" --call-s 180 2>&1 | tail -3
    $VS pytorch --models "$2" --compile-pcts ${COMPILE_PCTS:-40} --call-s ${PYTORCH_S:-330} 2>&1 | grep -v "^\$" | tail -4
    $VS untuned --models "$2" --call-s ${UNTUNED_S:-200} 2>&1 | tail -3
    if [ -n "${3:-}" ]; then
      setsid nohup $VS tune --models "$3" --pcts ${TUNE_PCTS:-40} --budgets ${BUDGETS:-600} --call-s 3000 \
        > /tmp/vs-tune.log 2>&1 < /dev/null &
      echo "tuning $3 in the background (pid $!)"
    fi
    python3 benchmarks/vs_pytorch.py table --results "$R" | tail -12
    ;;
  wait)
    end=$((SECONDS + ${2:-540}))
    while [ $SECONDS -lt $end ] && pgrep -f "vs_pytorch.py" > /dev/null; do sleep 10; done
    tail -5 /tmp/vs-tune.log; ls /tmp/vs/tune-*/ 2>/dev/null | head; python3 -m tunekit.cli records /tmp/vs 2>/dev/null | tail -3
    for d in /tmp/vs/tune-*/records-*; do [ -f "$d/database_tuning_record.json" ] && echo "$d: $(wc -l < "$d/database_tuning_record.json") trials"; done; true
    ;;
  finish)
    end=$((SECONDS + ${2:-540}))
    while [ $SECONDS -lt $end ] && pgrep -f "vs_pytorch.py" > /dev/null; do sleep 10; done
    tail -5 /tmp/vs-tune.log
    for so in /tmp/vs/tune-*/*-gpu*.so; do
      m=$(basename "$(dirname "$so")" | sed 's/^tune-//; s/-gpu[0-9]*$//'); pct=$(basename "$so" .so | sed 's/.*-gpu//')
      timeout 120 python3 -m tunekit.cli bench "$so" --gpu-pct "$pct" --compare-onnx "$W/$m.onnx" --json \
        > "$R/bench-$m-gpu$pct.json" && python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1], r['p50_ms'], r['sm_count'], r['numerics']['outputs'])" "$R/bench-$m-gpu$pct.json"
      cp "$(dirname "$so")/report.json" "$R/report-$m-gpu$pct.json"
    done
    python3 benchmarks/vs_pytorch.py table --results "$R" | tail -12
    ;;
esac
