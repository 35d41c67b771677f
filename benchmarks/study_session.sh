#!/usr/bin/env bash
# Tuning studies on the device: one background chain, and device calls of <= 10 minutes that
# wait on it. A resumed tune re-pays its ~200 s of start-up and finish per call; one process across calls does not.
#   MODELS=resnet18 bash benchmarks/study_session.sh start   # the chain: exports, PyTorch at 40% for scale, STEPS
#   DRY=1 ... start                                         # print the chain only
#   bash benchmarks/study_session.sh wait 540 [PATTERN]      # progress; everything so far comes back in $OUT
#                                                            # (returns early once PATTERN is in the chain's log)
# The chain first exports the models, then times PyTorch for TORCH_MODELS (default MODELS; none: not timed), its
# TORCH_VARIANTS (default graphs-fp32,graphs-fp16; maxautotune-fp16: torch.compile(mode="max-autotune"), about 3
# minutes a model) at TORCH_PCTS (default 40).
# The chain runs STEPS in order (default: study):
#   pytest  pytest -m gpu (PYTEST_ARGS: which tests, default tests/; PYTEST_S: its time limit, default 900: the
#           11 GPU tests took more than 420 s on the H200, the stock half of test_design_spaces among them)
#   torch   PyTorch again, after the steps before it: TORCH_LATE_VARIANTS (e.g. maxautotune-fp16, whose minutes of
#           compiling would otherwise delay every tune) for TORCH_MODELS at TORCH_PCTS, appended to the same results
#   gemm    benchmarks/gemm_layouts.py at 40%: GPT-2's LM head with its weight [K, N] and [N, K] (GEMM_FLAGS: more flags)
#   r18     ResNet-18 tuned at 40% alone for R18_TRIALS trials (issue 14's seconds per trial), flags R18_FLAGS
#   r18b    the same with R18B_FLAGS (a second setting, side by side in the same lease); r18c: R18C_FLAGS
#   coord   coordinator_scaling.py on ResNet-18 at 40%: COORD_SETUPS (default 2x2x1,4x2x2: 1 GPU against 2, issue
#           14's 2-GPU target), each GPU with COORD_CORES cores (default 16, the H100 machine's), COORD_TRIALS
#           trials (default 768: the clients' start-up is part of the tuning wall and does not shrink with more
#           GPUs, so more trials dilute it), and the single process without Ray (COORD_FLAGS=--no-single-process:
#           not); resumable (setups in its JSON are kept). A setup named twice runs twice and the table pools
#           its runs: COORD_SETUPS=2x2x1,4x2x2,4x2x2,2x2x1 lets the VM's CPU drift fall on both setups alike
#   tt      benchmarks/tuning_time.py on ResNet-18 at 40%, TT_TRIALS trials, runs TT_ENGINES (default
#           tunekit,before: this tree against the source tree TT_BEFORE, e.g. a carried `git archive`)
#   tune40  per model: `tunekit tune M.onnx --gpu-pct 40 --trials $TRIALS --time-budget $TIME_S` (TRIALS_<model>,
#           TIME_S_<model> for one; TRIALS defaults to 1000, or to 100000 where a TIME_S is given), then
#           kernel_profile.py on the tuned model (µs per kernel in the model run, no CUDA graphs).
#           RESUME_DIR=D: D/records-<model>-gpu40.tgz (an earlier lease's $OUT, carried in) is unpacked
#           first and the tune goes on from it (--resume; TIME_S more seconds)
#   budgets per model: tuned at BUDGET_PCTS (default 40; 40,100: one search measured at both) for TIME_STEPS
#           (default 600,1200; TIME_STEPS_<model> for one) more seconds each, resumed on one out dir: issue 13's 10- and 30-minute columns
#           (report[-gpu<P>]-<seconds of tuning>.json per step; RESUME_DIR + BUDGET_DONE_S go on from an earlier lease,
#           BUDGET_DONE_S_<model> for one model)
#   study   per model: `tunekit tune M.onnx --gpu-pct 20,40,100 --robust --trials $TRIALS --time-budget $TIME_S`,
#           then `share_study.py matrix` at 20/40/60/100. TRIALS_<model>, TIME_S_<model>, FLAGS_<model> override per model.
#           RESUME_DIR=D: D/records-<model>.tgz (an earlier lease's study) is unpacked and goes on (--resume;
#           TRIALS and TIME_S more)
#   variants per model (VARIANTS_MODELS, default MODELS): an earlier lease's study (RESUME_DIR/records-<model>.tgz) without tuning: each share's
#           artifact (`tunekit compile --share`) and the share-robust one (`tunekit compile --variants`), then
#           `share_study.py matrix` at 20/40/60/100 (the artifact with a variant per share beside the shares' own)
# START_AFTER="CONDITION": the chain's GPU work waits, after the exports, until CONDITION holds (e.g. a fleet_session's
# setup on the same GPU is done: "grep -q 'sequential rc' /tmp/fleetres/chain.log").
# LANES="STEPS[:MODELS];STEPS[:MODELS]" instead of STEPS: lane i runs its steps (for its MODELS) on GPU i with the
# i-th slice of the cores, the lanes side by side, e.g. LANES="tt;budgets:resnet18" on nvidia-h100-x2.
# Results: /tmp/studyres (reports, matrices, logs), returned as $OUT/studyres.tgz, and the records of each run as
# $OUT/records-<run>.txz.part-* (a device call brings back only a few files of at most 16 MiB, so everything
# travels as tarballs). RESUME_DIR may hold either form: records-<run>.tgz or records-<run>.txz.part-*.
set -uo pipefail
export PYTHONPATH=/root/site:$PWD CUDA_PATH=${CUDA_PATH:-/usr/local/cuda} PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled
OUT=${OUT:-/tmp/study-out}; R=/tmp/studyres; W=/tmp/study; mkdir -p "$OUT" "$R" "$W" /tmp/vs
copy() {
  tar czf "$OUT/studyres.tgz" -C /tmp studyres 2>/dev/null
  for d in "$W"/*/; do
    [ -d "$d" ] || continue
    run=$(basename "$d"); dbs=$(cd "$d" && ls -d records-* 2>/dev/null)
    # xz, not gzip: each share's records repeat the same traces, which only xz's window spans (ResNet-18's
    # 2 x 4,235 records: 25 MB gzipped, 1.9 MB in xz); in parts of at most 15 MiB, a device call's file limit
    rm -f "$OUT/records-$run".txz.part-*
    [ -n "$dbs" ] && tar cf - -C "$d" $dbs 2>/dev/null | xz -T0 -6 | split -b 15m - "$OUT/records-$run.txz.part-"
  done; true
}
trap copy EXIT
case "$1" in
  start)
    # An earlier lease's records (RESUME_DIR): records-<run>.tgz, or records-<run>.txz.part-* (put together here)
    if [ -n "${RESUME_DIR:-}" ]; then
      rm -rf /tmp/resume && mkdir -p /tmp/resume && cp "$RESUME_DIR"/*.tgz /tmp/resume/ 2>/dev/null
      for part in "$RESUME_DIR"/*.txz.part-aa; do
        [ -f "$part" ] && cat "${part%aa}"* > "/tmp/resume/$(basename "${part%.part-aa}")"
      done
      RESUME_DIR=/tmp/resume
    fi
    # records_file NAME: the earlier lease's NAME.txz or NAME.tgz (tar xf reads either), or nothing
    records_file() { for f in "${RESUME_DIR:-/nonexistent}/$1".txz "${RESUME_DIR:-/nonexistent}/$1".tgz; do [ -f "$f" ] && { echo "$f"; return; }; done; }
    MODELS=${MODELS:-resnet18}; STEPS=${STEPS:-study}; VARIANTS_MODELS=${VARIANTS_MODELS:-}
    if [ -n "${LANES:-}" ]; then  # the exports below need every lane's steps and models
      STEPS=""; lane_models=""
      IFS=';' read -ra lanes <<< "$LANES"
      for lane in "${lanes[@]}"; do STEPS="$STEPS,${lane%%:*}"; [[ $lane == *:* ]] && lane_models="$lane_models,${lane#*:}"; done
      STEPS=${STEPS#,}; MODELS=${lane_models#,}; MODELS=${MODELS:-resnet18}
    fi
    # A carried TT_BEFORE (e.g. .oldtk) leaves the checkout at the next device call (each call's tree
    # copy drops what an earlier call carried), long before the tt step runs: keep a copy under /tmp.
    if [ -n "${TT_BEFORE:-}" ] && [ -d "$TT_BEFORE" ] && [ -z "${DRY:-}" ]; then
      rm -rf /tmp/tt-before && cp -r "$TT_BEFORE" /tmp/tt-before && TT_BEFORE=/tmp/tt-before
    fi
    TORCH_MODELS=${TORCH_MODELS:-$MODELS}; [ "$TORCH_MODELS" = none ] && TORCH_MODELS=""
    # prelude: the chain's first commands, exports and PyTorch (in the background chain: torch.compile's max-autotune
    # takes about 3 minutes a model, past a device call's 10)
    prelude() {
      for m in $(printf '%s\n' ${TORCH_MODELS//,/ } ${MODELS//,/ } ${VARIANTS_MODELS//,/ } \
                 $([[ ,$STEPS, == *,r18* || ,$STEPS, == *,tt,* || ,$STEPS, == *,coord,* ]] && echo resnet18) | awk '!seen[$0]++'); do
        echo "[ -f /tmp/vs/$m.onnx ] || python3 benchmarks/torch_models.py export --model $m --out /tmp/vs/$m.onnx 2>&1 | tail -1"
      done
      [ -z "${START_AFTER:-}" ] || echo "until ${START_AFTER}; do sleep 5; done; echo \"started after: \${SECONDS}s\""
      [ -z "$TORCH_MODELS" ] || echo "python3 benchmarks/vs_pytorch.py pytorch --models $TORCH_MODELS --pcts ${TORCH_PCTS:-40}" \
        "--variants ${TORCH_VARIANTS:-graphs-fp32,graphs-fp16} --work /tmp/vs --results $R --call-s 1800" \
        "> $R/pytorch.log 2>&1; echo \"pytorch rc=\$?\""
    }
    # emit_steps STEPS: the chain's commands for those steps, for MODELS
    emit_steps() {
      for step in ${1//,/ }; do case $step in
        pytest) echo "timeout ${PYTEST_S:-900} python3 -m pytest -q -rfE --tb=short --durations=15 -m gpu ${PYTEST_ARGS:-tests} > $R/pytest_gpu.txt 2>&1; echo \"pytest rc=\$?\"" ;;
        torch) [ -z "$TORCH_MODELS" ] || echo "python3 benchmarks/vs_pytorch.py pytorch --models $TORCH_MODELS" \
                 "--pcts ${TORCH_PCTS:-40} --variants ${TORCH_LATE_VARIANTS:?TORCH_LATE_VARIANTS} --work /tmp/vs" \
                 "--results $R --call-s 1800 > $R/pytorch-late.log 2>&1; echo \"pytorch late rc=\$?\"" ;;
        gemm) echo "python3 benchmarks/gemm_layouts.py --gpu-pct 40 --json $R/gemm_layouts.json ${GEMM_FLAGS:-}" \
                  "> $R/gemm_layouts.md 2> $R/gemm_layouts.log; echo \"gemm rc=\$?\"" ;;
        r18|r18b|r18c) flags=${R18_FLAGS:---trials-per-iter 16}; [ $step = r18b ] && flags=${R18B_FLAGS:?R18B_FLAGS}
             [ $step = r18c ] && flags=${R18C_FLAGS:?R18C_FLAGS}
             echo "mkdir -p $R/$step-gpu40"
             echo "python3 -m tunekit.cli tune /tmp/vs/resnet18.onnx --gpu-pct 40 --trials ${R18_TRIALS:-256}" \
                  "$flags --out $W/$step-gpu40 --json > $R/$step-gpu40/tune.json 2> $R/$step-gpu40/tune.log"
             echo "echo \"$step-gpu40 tune rc=\$?\"; cp $W/$step-gpu40/report.json $R/$step-gpu40/ 2>/dev/null" ;;
        coord) echo "python3 benchmarks/coordinator_scaling.py --model /tmp/vs/resnet18.onnx --gpu-pct 40" \
                    "--trials ${COORD_TRIALS:-768} --trials-per-iter 16 --setups ${COORD_SETUPS:-2x2x1,4x2x2}" \
                    "--cores-per-gpu ${COORD_CORES:-16} ${COORD_FLAGS:-} --keep-reports $R/coord-reports" \
                    "--results $R/coordinator_scaling.md > $R/coordinator_scaling.log 2>&1; echo \"coord rc=\$?\"" ;;
        tt) echo "python3 benchmarks/tuning_time.py --model /tmp/vs/resnet18.onnx --gpu-pct 40 --trials ${TT_TRIALS:-32}" \
                 "--trials-per-iter 16 --engines ${TT_ENGINES:-tunekit,before} ${TT_BEFORE:+--before-src $TT_BEFORE}" \
                 "--results $R/tuning_time.md > $R/tuning_time.log 2>&1; echo \"tt rc=\$?\"" ;;
        tune40) for m in ${MODELS//,/ }; do  # each model tuned at 40% alone (issue 13's tuned column)
             echo "mkdir -p $R/$m-gpu40 $W/$m-gpu40"
             resume=""; earlier=$(records_file records-$m-gpu40)
             [ -n "${RESUME_DIR:-}" ] && [ -f "$earlier" ] && resume="--resume" && echo "tar xf $earlier -C $W/$m-gpu40"
             trials=TRIALS_$m; time_s=TIME_S_$m  # per-model overrides, as the study step's
             cap=1000; [ -n "${!time_s:-${TIME_S:-}}" ] && cap=100000  # a time budget given: it, not 1000 trials, ends the tune
             echo "python3 -m tunekit.cli tune /tmp/vs/$m.onnx --gpu-pct 40 --trials ${!trials:-${TRIALS:-$cap}}" \
                  "--trials-per-iter 16 --time-budget ${!time_s:-${TIME_S:-600}} $resume --out $W/$m-gpu40 --json" \
                  "> $R/$m-gpu40/tune.json 2> $R/$m-gpu40/tune.log"
             echo "echo \"$m-gpu40 tune rc=\$?\"; cp $W/$m-gpu40/report.json $R/$m-gpu40/ 2>/dev/null"
             # where the tuned model's time goes, kernel by kernel, as the whole model runs
             echo "python3 benchmarks/kernel_profile.py /tmp/vs/$m.onnx --gpu-pct 40 --records $W/$m-gpu40/records-gpu40" \
                  "--json $R/$m-gpu40/kernel_profile.json > $R/$m-gpu40/kernel_profile.md 2> $R/$m-gpu40/kernel_profile.log"
           done ;;
        budgets) for m in ${MODELS//,/ }; do  # issue 13's 10- and 30-minute columns, one search for BUDGET_PCTS
             # TIME_STEPS (default 600,1200): each step a `tunekit tune --resume --time-budget` of that many more
             # seconds of tuning on the same out dir, its report kept as report-<seconds so far>.json (the
             # checkpoints). RESUME_DIR=D: D/records-<model>-budgets.tgz (an earlier lease's) goes on, and
             # BUDGET_DONE_S says how many seconds of tuning it already had.
             # BUDGET_DONE_S_<model>: one model's seconds so far, where the lanes' earlier steps differed
             run=$m-budgets; done_s=BUDGET_DONE_S_$m; done_s=${!done_s:-${BUDGET_DONE_S:-0}}; pcts=${BUDGET_PCTS:-40}
             echo "mkdir -p $R/$run $W/$run"
             resume=""; earlier=$(records_file records-$run)
             [ -n "${RESUME_DIR:-}" ] && [ -f "$earlier" ] && resume="--resume" && echo "tar xf $earlier -C $W/$run"
             [ -z "$resume" ] && done_s=0  # BUDGET_DONE_S is for the runs that go on, not a lane's fresh model
             steps=TIME_STEPS_$m; steps=${!steps:-${TIME_STEPS:-600,1200}}  # TIME_STEPS_<model> for one model
             for t in ${steps//,/ }; do done_s=$((done_s + t))
               echo "python3 -m tunekit.cli tune /tmp/vs/$m.onnx --gpu-pct $pcts --trials 100000 --trials-per-iter 16" \
                    "--time-budget $t $resume --out $W/$run --json > $R/$run/tune-$done_s.json 2> $R/$run/tune-$done_s.log"
               # report.json, and with several shares report-gpu<P>.json each: kept as <name>-<seconds so far>.json
               echo "echo \"$run tune to ${done_s}s rc=\$?\"; for f in $W/$run/report*.json; do" \
                    "cp \$f $R/$run/\$(basename \$f .json)-$done_s.json; done"
               resume="--resume"
             done
           done ;;
        study) for m in ${MODELS//,/ }; do
             echo "mkdir -p $R/$m $W/$m"
             # an earlier lease's study of this model (RESUME_DIR/records-<model>.tgz) goes on with --resume
             resume=""; earlier=$(records_file records-$m)
             [ -n "${RESUME_DIR:-}" ] && [ -f "$earlier" ] && resume="--resume" && echo "tar xf $earlier -C $W/$m"
             # per-model overrides, e.g. TRIALS_resnet18=160 TIME_S_bert=330 FLAGS_mobilenet_v2="--precision fp32"
             trials=TRIALS_$m; time_s=TIME_S_$m; flags=FLAGS_$m
             echo "python3 -m tunekit.cli tune /tmp/vs/$m.onnx --gpu-pct 20,40,100 --robust --trials ${!trials:-${TRIALS:-1000}}" \
                  "--trials-per-iter 16 --time-budget ${!time_s:-${TIME_S:-600}} $resume ${!flags:-} --out $W/$m --json" \
                  "> $R/$m/tune.json 2> $R/$m/tune.log"
             echo "echo \"$m tune rc=\$?\"; cp $W/$m/report*.json $R/$m/ 2>/dev/null"
             echo "python3 benchmarks/share_study.py matrix --work $W/$m --kind gpu --pcts 20,40,60,100 > $R/$m/matrix.log 2>&1"
             echo "echo \"$m matrix rc=\$?\"; cp $W/$m/study_matrix.* $R/$m/ 2>/dev/null"
           done ;;
        variants) for m in ${VARIANTS_MODELS:-${MODELS//,/ }}; do
             echo "mkdir -p $W/$m $R/$m && tar xf $(records_file records-$m) -C $W/$m"
             for p in 20 40 100; do
               echo "(python3 -m tunekit.cli compile /tmp/vs/$m.onnx --records $W/$m --share gpu$p --out $W/$m/$m-gpu$p.so" \
                    "> $R/$m/compile-gpu$p.log 2>&1; echo \"$m gpu$p compiled rc=\$?\") &"
             done
             echo "(python3 -m tunekit.cli compile /tmp/vs/$m.onnx --records $W/$m --variants --out $W/$m/$m-robust.so" \
                  "> $R/$m/compile-variants.log 2>&1; echo \"$m variants compiled rc=\$?\") &"
             echo "wait"
             echo "python3 benchmarks/share_study.py matrix --work $W/$m --kind gpu --pcts 20,40,60,100 > $R/$m/matrix.log 2>&1"
             echo "echo \"$m matrix rc=\$?\"; cp $W/$m/study_matrix.* $R/$m/ 2>/dev/null"
           done ;;
        *) echo "unknown step $step" >&2; exit 2 ;;
      esac; done
    }
    if [ -n "${LANES:-}" ]; then
      # Each lane is a chain of its own on one GPU and its slice of the cores (CUDA_VISIBLE_DEVICES=i, taskset),
      # the lanes side by side: one 2-GPU machine does two H100 machines' work (16 cores each on nvidia-h100-x2).
      IFS=';' read -ra lanes <<< "$LANES"; per=$(( $(nproc) / ${#lanes[@]} ))
      for i in "${!lanes[@]}"; do
        lane=${lanes[$i]}; models=$MODELS; [[ $lane == *:* ]] && models=${lane#*:}
        { echo "set -u"; MODELS=$models emit_steps "${lane%%:*}"; echo "echo \"lane $i done\""; } > /tmp/study-lane-$i.sh
      done
      {
        echo "set -u"; prelude
        for i in "${!lanes[@]}"; do
          echo "CUDA_VISIBLE_DEVICES=$i taskset -c $((i * per))-$((i * per + per - 1)) bash /tmp/study-lane-$i.sh 2>&1 | sed -u 's/^/[gpu$i] /' &"
        done
        echo "wait; echo chain done"
      } > /tmp/study-chain.sh
      [ -n "${DRY:-}" ] && cat /tmp/study-lane-*.sh
    else
      { echo "set -u"; prelude; emit_steps "$STEPS"; echo "echo chain done"; } > /tmp/study-chain.sh
    fi
    [ -n "${DRY:-}" ] && { cat /tmp/study-chain.sh; exit 0; }  # DRY=1: print the chain, run nothing
    # The chain runs in a copy of the tree: every device call copies the working tree over the checkout again, and
    # a step that imports a module just then reads a file being rewritten (`pytest -m gpu` once failed to collect
    # six test files, "import file mismatch").
    rm -rf /tmp/study-tree && mkdir -p /tmp/study-tree
    tar cf - --exclude=./.git --exclude='./.devcarry-*' . | tar xf - -C /tmp/study-tree
    (cd /tmp/study-tree && PYTHONPATH=/root/site:/tmp/study-tree setsid nohup bash /tmp/study-chain.sh \
      > "$R/chain.log" 2>&1 < /dev/null &)
    echo "study chain in the background, in /tmp/study-tree: $STEPS"
    ;;
  wait)
    end=$((SECONDS + ${2:-540}))
    until=${3:-chain done}
    while [ $SECONDS -lt $end ] && ! grep -q "$until" "$R/chain.log" 2>/dev/null; do sleep 10; done
    cat "$R/chain.log"; tail -3 "$R/pytest_gpu.txt" 2>/dev/null
    for d in "$W"/*/records-*; do
      [ -f "$d/database_tuning_record.json" ] && echo "$d: $(wc -l < "$d/database_tuning_record.json") records"
    done; cat "$R"/*/study_matrix.md "$R"/tuning_time.md 2>/dev/null; true
    ;;
esac
