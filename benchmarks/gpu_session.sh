#!/usr/bin/env bash
# What we run on the GPU device machine (H100), after the carried wheels are installed.
#   bash benchmarks/gpu_session.sh smoke   # pytest -m gpu + tunekit tune tiny_cnn --gpu-pct 40
#   bash benchmarks/gpu_session.sh bench   # benchmarks/tuning_time.py, ResNet-18 at 40%
#   bash benchmarks/gpu_session.sh check   # pytest -m gpu, then a torchvision ResNet-18 tuned at 40% (fp16,
#                                          # tensor cores, CUDA graphs), tunekit bench on its artifact
#   STEP=pytorch MODELS=resnet18,bert bash benchmarks/gpu_session.sh vs   # a step of benchmarks/vs_pytorch.py
# Outputs go to $OUT (the device tool brings them back); commit what matters.
set -uo pipefail
export PYTHONPATH=/root/site:$PWD CUDA_PATH=${CUDA_PATH:-/usr/local/cuda} PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled
OUT=${OUT:-/tmp/tunekit-gpu-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
case "${1:-smoke}" in
  check)
    timeout 420 python3 -m pytest -q -m gpu tests 2>&1 | tail -25 | tee "$OUT/pytest_gpu.txt"
    mkdir -p /tmp/vs
    [ -f /tmp/vs/resnet18.onnx ] || python3 benchmarks/torch_models.py export --model resnet18 --out /tmp/vs/resnet18.onnx
    timeout ${TUNE_S:-420} python3 -m tunekit.cli tune /tmp/vs/resnet18.onnx --gpu-pct 40 --trials ${TRIALS:-32} \
      --trials-per-iter 16 --out /tmp/r18 --json > "$OUT/r18_check.json" 2> "$OUT/r18_check.log"; echo "tune rc=$?"
    tail -3 "$OUT/r18_check.log"
    python3 - "$OUT/r18_check.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["report"]
lat = r["latency_ms"]
print("precision", r["precision"], "cuda_graph", r["cuda_graph"], "choice", r["artifact_choice"])
print("latency untuned", lat["untuned"]["median_ms"], "tuned", lat["tuned"]["median_ms"],
      "tuned without graphs", (r.get("latency_without_cuda_graph_ms") or {}).get("median_ms"))
print("tensor cores", r["tensor_cores"], "trials", r["trials"], "tuning_wall_s", r["tuning_wall_s"], "wall_s", r["wall_s"])
print("numerics", r["numerics"]["tuned"])
print("phases", json.dumps(r["phases"]["per_trial_s"]), json.dumps(r["phases"].get("build_profile")))
for t in r["tasks"]:
    print("  ", t["name"][:40], t.get("trials"), t.get("untuned_us"), t.get("tuned_us"), t.get("best_tensorized"),
          t.get("record_applied"), t.get("negligible"))
PY
    [ -f /tmp/r18/resnet18-gpu40.so ] && timeout 120 python3 -m tunekit.cli bench /tmp/r18/resnet18-gpu40.so \
      --gpu-pct 40 --compare-onnx /tmp/vs/resnet18.onnx --json > "$OUT/r18_bench.json" && tail -c 1500 "$OUT/r18_bench.json"
    cp /tmp/r18/report.json "$OUT/r18_report.json" 2>/dev/null
    ;;
  vs)
    python3 benchmarks/vs_pytorch.py ${STEP:-all} --models ${MODELS:-resnet18,resnet50,mobilenet_v2,bert} \
      --pcts ${PCTS:-40,100} --budgets ${BUDGETS:-600,1800} --call-s ${CALL_S:-540} --work /tmp/vs \
      --results ${RESULTS:-benchmarks/results/h100-vs-pytorch} 2>&1 | tail -30
    cp ${RESULTS:-benchmarks/results/h100-vs-pytorch}/* "$OUT"/ 2>/dev/null
    ;;
  smoke)
    python3 -m tunekit.cli example --out /tmp/tiny_cnn.onnx
    python3 -m tunekit.cli tune /tmp/tiny_cnn.onnx --gpu-pct 40 --trials ${TRIALS:-32} --out /tmp/gpu40 --json \
      > "$OUT/tiny_gpu40.json" 2> "$OUT/tiny_gpu40.log"; echo "tune rc=$?"; tail -5 "$OUT/tiny_gpu40.log"
    python3 - "$OUT/tiny_gpu40.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["report"]
print({k: r[k] for k in ("trials", "tuning_wall_s", "wall_s")}, r["latency_ms"]["speedup"], r["environment"])
print(json.dumps(r["phases"]))
PY
    cp /tmp/gpu40/report.json "$OUT/tiny_gpu40_report.json" 2>/dev/null
    timeout 400 python3 -m pytest -q -m gpu tests 2>&1 | tail -15 | tee "$OUT/pytest_gpu.txt"
    ;;
  bench)
    python3 benchmarks/tuning_time.py --model ${MODEL:-resnet18} --gpu-pct ${PCT:-40} --trials ${TRIALS:-64} \
      --trials-per-iter ${PER_ITER:-16} --results "$OUT/tuning_time_${MODEL:-resnet18}_gpu${PCT:-40}.md" 2>&1 | tail -40
    ;;
  coord)
    # The Ray coordinator on the GPU: a small smoke run (SMOKE=0 skips it), then clients x servers
    # scaling on ResNet-18. Resumable across calls: the JSON lives in the results dir (carried with
    # the tree) and setups already in it are kept; copies come back through $OUT.
    if [ "${SMOKE:-1}" = 1 ]; then
      python3 -m tunekit.cli example --out /tmp/tiny_cnn.onnx
      timeout 240 python3 -m tunekit.cli tune /tmp/tiny_cnn.onnx --gpu-pct 40 --clients 2 --servers 2 --trials 8 \
        --trials-per-iter 4 --out /tmp/coord --json > "$OUT/coord_smoke.json" 2> "$OUT/coord_smoke.log"
      rc=$?; echo "coord smoke rc=$rc"; grep -v "^\s*$" "$OUT/coord_smoke.log" | tail -8
      [ $rc -eq 0 ] || exit $rc
    fi
    R=${RESULTS:-benchmarks/results/h100-resnet18-gpu40-coordinator}
    python3 benchmarks/coordinator_scaling.py --model ${MODEL:-resnet18} --gpu-pct ${PCT:-40} --trials ${TRIALS:-48} \
      --trials-per-iter ${PER_ITER:-8} --setups ${SETUPS:-1x1,2x2,4x2} --no-single-process \
      --results "$R/coordinator_scaling_${MODEL:-resnet18}_gpu${PCT:-40}.md" 2>&1 | tail -20
    cp "$R"/coordinator_scaling_* "$OUT"/
    ;;
  ms)
    # Issue 15 (and 14's warm start) on ResNet-18: STEP=a|b|c, one device call each, back to back
    # (the machine keeps /tmp/ms while warm). Results in $R, copied to $OUT.
    R=${RESULTS:-benchmarks/results/h100-resnet18-multi-share}; mkdir -p /tmp/vs /tmp/ms "$R"
    [ -f /tmp/vs/resnet18.onnx ] || python3 benchmarks/torch_models.py export --model resnet18 --out /tmp/vs/resnet18.onnx
    MS="python3 benchmarks/multi_share.py run --model /tmp/vs/resnet18.onnx --pcts 20,40,100 --trials ${TRIALS:-64}
        --trials-per-iter 16 --work /tmp/ms --timeout-s ${SETUP_S:-420} --results $R"
    case "${STEP:-a}" in
      a) $MS --setups every,alone40 ;;
      b) $MS --setups alone100,alone20
         timeout 200 python3 benchmarks/measure_noise.py --out-dir /tmp/ms/every --kind gpu --pcts 20,40,100 \
           --candidates 24 --rounds 3 --results "$R/measure_noise.md" 2>&1 | tail -25 ;;
      c) timeout 300 python3 -m tunekit.cli tune /tmp/vs/resnet18.onnx --gpu-pct 40 --trials ${TRIALS:-64} \
           --trials-per-iter 16 --warm-start /tmp/ms/alone100 --out /tmp/ms/warm40 --json > /tmp/ms/warm40.json \
           2> /tmp/ms/warm40.log; echo "warm40 rc=$?"; tail -2 /tmp/ms/warm40.log
         python3 benchmarks/warm_start_curve.py --cold /tmp/ms/alone40 --warm /tmp/ms/warm40 --share gpu40 \
           --results "$R/warm_start.md" 2>&1 | tail -12
         cp /tmp/ms/warm40/report.json "$R/warm40_report.json" 2>/dev/null ;;
    esac
    python3 benchmarks/multi_share.py summarize --results "$R" > /dev/null 2>&1
    for f in /tmp/ms/*/report.json; do d=$(basename $(dirname $f)); cp "$f" "$R/${d}_report.json"; done
    cp -r "$R" "$OUT"/
    ;;
  jobs)
    # Two tunekit jobs on one GPU at 40% + 40% (the ledger, one MPS daemon, the measurement lock), then a
    # third at 40% that the ledger refuses while both run; pytest -m gpu after.
    mkdir -p /tmp/vs /tmp/jobs; [ -f /tmp/vs/resnet18.onnx ] || python3 benchmarks/torch_models.py export --model resnet18 --out /tmp/vs/resnet18.onnx
    [ -f /tmp/vs/mobilenet_v2.onnx ] || python3 benchmarks/torch_models.py export --model mobilenet_v2 --out /tmp/vs/mobilenet_v2.onnx
    for m in resnet18 mobilenet_v2; do
      timeout 300 python3 -m tunekit.cli tune /tmp/vs/$m.onnx --gpu-pct 40 --trials ${TRIALS:-32} --trials-per-iter 16 \
        --out /tmp/jobs/$m --json > /tmp/jobs/$m.json 2> /tmp/jobs/$m.log & sleep 5
    done
    sleep 20; python3 -c "import json,tunekit.shares.ledger as l; print(json.dumps(l.snapshot(), indent=1)[:1500])"
    timeout 60 python3 -m tunekit.cli tune /tmp/vs/resnet18.onnx --gpu-pct 40 --trials 4 --out /tmp/jobs/third 2>&1 | tail -2
    wait; for m in resnet18 mobilenet_v2; do python3 - /tmp/jobs/$m.json <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["report"]
e = r["environment"]
print(r["model"], "sm_count", e.get("sm_count_at_share"), "daemon started here", e.get("mps_daemon_started_here"),
      "tuned", r["latency_ms"]["tuned"]["median_ms"], "trials", r["trials"], "lock", r["phases"]["total_s"].get("lock_wait_s"))
PY
    done; mkdir -p "$OUT/jobs"; cp /tmp/jobs/*.json "$OUT/jobs/"; tail -3 /tmp/jobs/*.log
    timeout 420 python3 -m pytest -q -m gpu tests 2>&1 | tail -15 | tee "$OUT/pytest_gpu.txt"
    ;;
  build)
    # Issue 14: pytest -m gpu; the lean NVRTC compile against TVM's on the same candidates
    # (benchmarks/build_compile.py); then a held-out ResNet-18 at 40% for TRIALS trials (per-trial phases).
    mkdir -p /tmp/vs; [ -f /tmp/vs/resnet18.onnx ] || python3 benchmarks/torch_models.py export --model resnet18 --out /tmp/vs/resnet18.onnx
    # Each part fits one 10-minute call on its own (PARTS=pytest,compile,tune picks them). A tune's whole
    # command is its tuning (--time-budget) plus about 120 s around it: the limits leave room for that.
    R=${RESULTS:-benchmarks/results/h100-build-compile}; mkdir -p $R
    case ",${PARTS:-compile,tune}," in *,pytest,*)
      timeout 300 python3 -m pytest -q -m gpu tests 2>&1 | tail -8 | tee "$OUT/pytest_gpu.txt" ;; esac
    case ",${PARTS:-compile,tune}," in *,compile,*)
      timeout 240 python3 benchmarks/build_compile.py --model /tmp/vs/resnet18.onnx --candidates ${CANDIDATES:-64} \
        --per-task 16 --rounds 1 --out $R > $R/build_compile.log 2>&1; echo "build_compile rc=$?"
      grep -v "^\[" $R/build_compile.log | tail -12 ;; esac
    case ",${PARTS:-compile,tune}," in *,tune,*) ;; *) cp -r $R "$OUT"/; exit 0 ;; esac
    timeout ${TUNE_S:-560} python3 -m tunekit.cli tune /tmp/vs/resnet18.onnx --gpu-pct 40 --trials ${TRIALS:-256} \
      --trials-per-iter 16 --time-budget ${BUDGET_S:-300} --out /tmp/r18 --json > "$R/r18_${TRIALS:-256}.json" 2> "$R/r18_${TRIALS:-256}.log"
    echo "tune rc=$?"; tail -2 "$R/r18_${TRIALS:-256}.log"
    python3 - "$R/r18_${TRIALS:-256}.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["report"]
p = r["phases"]
print("trials", r["trials"], "tuning_wall_s", r["tuning_wall_s"], "per trial", round(r["tuning_wall_s"] / max(1, r["trials"]["measured"]), 3),
      "wall_s", r["wall_s"], "latency", r["latency_ms"]["untuned"]["median_ms"], "->", r["latency_ms"]["tuned"]["median_ms"])
print("per_trial", json.dumps(p["per_trial_s"])); print("build", json.dumps({k: v for k, v in p["build_profile"].items() if "passes" not in k}))
print("command_s", json.dumps(r.get("command_s")))
PY
    cp -r $R "$OUT"/
    ;;
  study)
    # Issue 15's study, one model per STEP=tune (resumable: TIME_S of tuning per call, until TRIALS per share)
    # then STEP=matrix (every artifact at 20/40/60/100). The work dir travels back as $OUT/study-<model>.tgz.
    M=${MODEL:-resnet18}; W=/tmp/study/$M; mkdir -p /tmp/vs /tmp/study
    [ -f /tmp/vs/$M.onnx ] || python3 benchmarks/torch_models.py export --model $M --out /tmp/vs/$M.onnx
    [ -d $W ] || { [ -f study-$M.tgz ] && tar xzf study-$M.tgz -C /tmp/study; }
    case "${STEP:-tune}" in
      # A 3-share command spends about 200 s around its tuning, and --robust about 150 s more (measured at
      # 64 trials): ROBUST=1 only on the last call, so that the other calls tune for most of theirs.
      tune) timeout ${CALL_S:-580} python3 -m tunekit.cli tune /tmp/vs/$M.onnx --gpu-pct 20,40,100 \
              $([ "${ROBUST:-0}" = 1 ] && echo --robust) \
              --trials ${TRIALS:-1000} --trials-per-iter 16 --time-budget ${TIME_S:-300} --resume ${EXTRA:-} \
              --out $W --json > $W.json 2> $W.log; echo "study tune rc=$?"; tail -4 $W.log ;;
      matrix) python3 benchmarks/share_study.py matrix --work $W --pcts 20,40,60,100 2>&1 | tail -20 ;;
    esac
    tar czf "$OUT/study-$M.tgz" -C /tmp/study $M $M.json $M.log 2>/dev/null; ls -la "$OUT"
    ;;
  share)
    # Issue 5's matrix; resumable across calls: the results dir travels back as a tarball.
    R=benchmarks/results/share-sensitivity-h100
    python3 benchmarks/share_sensitivity.py --gpu --model ${MODEL:-resnet18} --trials ${TRIALS:-64} \
      --trials-per-iter ${PER_ITER:-16} --results $R --time-limit-s ${LIMIT:-540} 2>&1 | tail -25; rc=${PIPESTATUS[0]}
    tar czf "$OUT/share.tgz" $R; echo "share rc=$rc"
    ;;
esac
