#!/usr/bin/env bash
# Issue 15's study on the device in one lease: one background chain, and device calls of <= 10 minutes that
# wait on it. A resumed tune re-pays its ~200 s of start-up and finish per call; one process across calls does not.
#   MODELS=resnet18 bash benchmarks/study_session.sh start   # exports, PyTorch at 40% for scale, then per model
#                                                            # in the background: the build-once tune + the matrix
#   bash benchmarks/study_session.sh wait 540                # progress; everything so far is copied to $OUT
# Per model (chain.sh below): `tunekit tune M.onnx --gpu-pct 20,40,100 --robust --trials $TRIALS --time-budget
# $TIME_S`, then `share_study.py matrix` at 20/40/60/100. AFTER_R18=N then tunes ResNet-18 at 40% alone for N
# trials (issue 14's seconds per trial). Results: /tmp/studyres/<model>/ (reports, matrix, logs, records).
set -uo pipefail
export PYTHONPATH=/root/site:$PWD CUDA_PATH=${CUDA_PATH:-/usr/local/cuda} PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled
OUT=${OUT:-/tmp/study-out}; R=/tmp/studyres; W=/tmp/study; mkdir -p "$OUT" "$R" "$W" /tmp/vs
copy() {
  for d in "$R"/*/; do
    m=$(basename "$d"); cp -r "$d" "$OUT"/ 2>/dev/null
    [ -d "$W/$m" ] && tar czf "$OUT/$m/records.tgz" -C "$W/$m" $(cd "$W/$m" && ls -d records-* 2>/dev/null) 2>/dev/null
  done
  cp "$R"/*.json "$R"/*.log "$OUT"/ 2>/dev/null; true
}
trap copy EXIT
case "$1" in
  start)
    MODELS=${MODELS:-resnet18}
    for m in ${MODELS//,/ }; do
      [ -f /tmp/vs/$m.onnx ] || python3 benchmarks/torch_models.py export --model $m --out /tmp/vs/$m.onnx 2>&1 | tail -1
    done
    # PyTorch at the same shares as the matrix, for scale (graphs, fp16 and fp32/TF32): a few seconds each.
    python3 benchmarks/vs_pytorch.py pytorch --models "$MODELS" --pcts ${TORCH_PCTS:-40} \
      --variants graphs-fp32,graphs-fp16 --work /tmp/vs --results "$R" --call-s 240 2>&1 | grep -v "^\$" | tail -3
    cat > /tmp/study-chain.sh <<EOF
set -u
for m in ${MODELS//,/ }; do
  mkdir -p $R/\$m
  python3 -m tunekit.cli tune /tmp/vs/\$m.onnx --gpu-pct 20,40,100 --robust --trials ${TRIALS:-1000} \
    --trials-per-iter 16 --time-budget ${TIME_S:-600} --out $W/\$m --json > $R/\$m/tune.json 2> $R/\$m/tune.log
  echo "\$m tune rc=\$?"
  cp $W/\$m/report*.json $R/\$m/ 2>/dev/null
  python3 benchmarks/share_study.py matrix --work $W/\$m --kind gpu --pcts 20,40,60,100 > $R/\$m/matrix.log 2>&1
  echo "\$m matrix rc=\$?"; cp $W/\$m/study_matrix.* $R/\$m/ 2>/dev/null
done
if [ -n "${AFTER_R18:-}" ]; then
  mkdir -p $R/r18-gpu40
  python3 -m tunekit.cli tune /tmp/vs/resnet18.onnx --gpu-pct 40 --trials ${AFTER_R18:-256} --trials-per-iter 16 \
    --out $W/r18-gpu40 --json > $R/r18-gpu40/tune.json 2> $R/r18-gpu40/tune.log
  echo "r18-gpu40 tune rc=\$?"; cp $W/r18-gpu40/report.json $R/r18-gpu40/ 2>/dev/null
fi
echo chain done
EOF
    setsid nohup bash /tmp/study-chain.sh > "$R/chain.log" 2>&1 < /dev/null &
    echo "study chain in the background (pid $!)"
    ;;
  wait)
    end=$((SECONDS + ${2:-540}))
    while [ $SECONDS -lt $end ] && ! grep -q "chain done" "$R/chain.log" 2>/dev/null; do sleep 10; done
    cat "$R/chain.log"
    for f in "$R"/*/tune.log; do echo "== $f"; grep -v "^\s*$" "$f" | tail -3; done
    for d in "$W"/*/records-*; do
      [ -f "$d/database_tuning_record.json" ] && echo "$d: $(wc -l < "$d/database_tuning_record.json") records"
    done; cat "$R"/*/study_matrix.md 2>/dev/null; true
    ;;
esac
