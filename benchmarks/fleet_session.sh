#!/usr/bin/env bash
# Issue 54's fleet benchmark on the device, in the background, with device calls of <= 10 minutes that wait on it.
#   bash benchmarks/fleet_session.sh start        # exports the zoo models, then the setups (below)
#   bash benchmarks/fleet_session.sh wait 540     # progress; results so far come back in $OUT
# FLEET="zoo model:pct,..." (default resnet50:40,mobilenet_v2:20,bert_base:20,distilbert:20: shares summing to 100%,
# two CNNs and two transformers that share workloads), FLEET_BUDGET seconds of tuning per setup (default 200),
# FLEET_ARGS more options of the fleet's command (e.g. "--clients 4"), ROUNDS of timing every artifact (default 1:
# a `tunekit bench` at a share costs about 25 s), SHARE_ROUNDS of share_concurrency.py on the fleet's artifacts
# (default 0: measured in benchmarks/results/h200x4-fleet). With two GPUs the one-after-another setup runs on GPU 1
# beside the other two on GPU 0, each on half of the cores (benchmarks/results/h200x2-fleet); with one, all three in
# turn (GPU0_SETUPS: GPU 0's setups, default fleet,parallel; AFTER_FLEET: a command once they are done; on one GPU
# SETUPS, default all three, then AFTER_FLEET). BEFORE: a command once the models are exported. With four
# or more: the fleet on GPU 0, side by side on GPU 1, and each model alone on GPUs 2.. at once,
# composed one after another (fleet.py --alone-on), each GPU with its share of the cores; AFTER_PARALLEL, AFTER_ALONE,
# AFTER_TABLE: commands to run once that work is done (e.g. `pytest -m gpu` with CUDA_VISIBLE_DEVICES of a free GPU);
# EXPORT_MORE: more zoo models to export.
set -uo pipefail
export PYTHONPATH=/root/site:/tmp/fleet-tree CUDA_PATH=${CUDA_PATH:-/usr/local/cuda} PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled
OUT=${OUT:-/tmp/fleet-out}; R=/tmp/fleetres; mkdir -p "$OUT" "$R"
copy() {  # every setup's report.json files too (where each command's wall went: command_s)
  (cd /tmp && find fleet-* ab -path fleet-tree -prune -o -name report.json -print0 2>/dev/null | tar czf "$R/reports.tgz" --null -T - 2>/dev/null)
  tar czf "$OUT/fleetres.tgz" --exclude='*.so' --exclude='*.onnx' --exclude='records-*' -C /tmp fleetres 2>/dev/null; true; }
trap copy EXIT
case "$1" in
  start)
    FLEET=${FLEET:-resnet50:40,mobilenet_v2:20,bert_base:20,distilbert:20}; B=${FLEET_BUDGET:-200}
    gpus=${GPUS:-$(nvidia-smi -L 2>/dev/null | wc -l)}; half=$(( $(nproc) / 2 ))
    rm -rf /tmp/fleet-tree && mkdir -p /tmp/fleet-tree  # every device call copies the tree over the checkout again
    tar cf - --exclude=./.git --exclude='./.devcarry-*' . | tar xf - -C /tmp/fleet-tree
    { echo "models:"; for item in ${FLEET//,/ }; do
        echo "  - {model: /tmp/zoo/models/${item%%:*}.onnx, gpu_pct: ${item##*:}, name: ${item%%:*}}"; done; } > $R/fleet.yaml
    fleet="python3 benchmarks/fleet.py --fleet $R/fleet.yaml --budget $B"
    {
      echo "set -u; cd /tmp/fleet-tree"
      for name in $(for item in ${FLEET//,/ }; do echo "${item%%:*}"; done) ${EXPORT_MORE:-}; do  # about 25 s each
        echo "python3 benchmarks/zoo.py export --work /tmp/zoo --models $name > $R/export-$name.log 2>&1 &"
      done
      echo "wait; echo exported; ${BEFORE:-true}"
      if [ "$gpus" -ge 4 ]; then  # GPU 0: the fleet; 1: side by side; 2 and up: each model alone (composed in turn)
        q=$(( $(nproc) / gpus ))
        on() { echo "CUDA_VISIBLE_DEVICES=$1 taskset -c $(( $1 * q ))-$(( $1 * q + q - 1 ))"; }
        alone=$(python3 -c "print(','.join(str(2 + i % ($gpus - 2)) for i in range(len('${FLEET}'.split(',')))))")
        echo "($(on 1) $fleet --setups parallel --work /tmp/fleet-par > $R/parallel.log 2>&1; echo \"parallel rc=\$?\";" \
             "${AFTER_PARALLEL:-true}) &"
        echo "($fleet --setups sequential --alone-on $alone --cores-per-gpu $q --work /tmp/fleet-seq > $R/sequential.log" \
             "2>&1; echo \"sequential rc=\$?\"; ${AFTER_ALONE:-true}) &"
        echo "$(on 0) $fleet --setups fleet --work /tmp/fleet-main --fleet-args \"${FLEET_ARGS:-}\" > $R/fleet.log 2>&1;" \
             "echo \"fleet rc=\$?\"; while pgrep -f 'fleet.py --fleet' > /dev/null; do sleep 5; done"
        echo "for d in main seq par; do cp /tmp/fleet-\$d/runs.json $R/runs-\$d.json 2>/dev/null; done"
        echo "($(on 0) $fleet --setups '' --runs /tmp/fleet-main/runs.json,/tmp/fleet-seq/runs.json,/tmp/fleet-par/runs.json" \
             "--rounds ${ROUNDS:-1} --results $R/fleet.md > $R/table.log 2>&1; echo \"table rc=\$?\"; ${AFTER_TABLE:-true}) &"
        share_on=$(on 1)
      elif [ "$gpus" -ge 2 ]; then
        echo "(CUDA_VISIBLE_DEVICES=1 taskset -c $half-$((2 * half - 1)) $fleet --setups sequential --work /tmp/fleet-seq" \
             "> $R/sequential.log 2>&1; echo \"sequential rc=\$?\") &"
        echo "CUDA_VISIBLE_DEVICES=0 taskset -c 0-$((half - 1)) $fleet --setups ${GPU0_SETUPS:-fleet,parallel}" \
             "--work /tmp/fleet-main --fleet-args \"${FLEET_ARGS:-}\" > $R/fleet.log 2>&1; echo \"GPU 0 rc=\$?\";" \
             "${AFTER_FLEET:-true}; wait"
        echo "for d in main seq; do cp /tmp/fleet-\$d/runs.json $R/runs-\$d.json 2>/dev/null; done"
        echo "CUDA_VISIBLE_DEVICES=0 $fleet --setups '' --runs /tmp/fleet-main/runs.json,/tmp/fleet-seq/runs.json" \
             "--rounds ${ROUNDS:-1} --results $R/fleet.md > $R/table.log 2>&1; echo \"table rc=\$?\""
      else  # the setups in turn (SETUPS, default all three), then the table
        echo "$fleet --setups ${SETUPS:-fleet,sequential,parallel} --work /tmp/fleet-main" \
             "--fleet-args \"${FLEET_ARGS:-}\" --rounds ${ROUNDS:-1} --results $R/fleet.md > $R/fleet.log 2>&1;" \
             "echo \"setups and table rc=\$?\"; cp /tmp/fleet-main/runs.json $R/; ${AFTER_FLEET:-true}"
      fi
      [ "${SHARE_ROUNDS:-0}" -gt 0 ] && echo "${share_on:-CUDA_VISIBLE_DEVICES=0} python3 benchmarks/share_concurrency.py --kind gpu" \
        "--artifacts \$(python3 -c \"import json; r = json.load(open('/tmp/fleet-main/runs.json'))['fleet']['artifacts'];" \
        "print(','.join(a + ':' + p for a, p in zip(r, '${FLEET}'.replace(',', ':').split(':')[1::2])))\")" \
        "--rounds ${SHARE_ROUNDS:-0} --repeats 1000 --results $R/share.md > $R/share.log 2>&1; echo \"share rc=\$?\""
      echo "wait; echo chain done"
    } > /tmp/fleet-chain.sh
    [ -n "${DRY:-}" ] && { cat /tmp/fleet-chain.sh; exit 0; }
    (setsid nohup bash /tmp/fleet-chain.sh > "$R/chain.log" 2>&1 < /dev/null &)
    echo "fleet chain in the background: $FLEET, $B s per setup, $gpus GPU(s)"
    ;;
  wait)
    end=$((SECONDS + ${2:-540}))
    while [ $SECONDS -lt $end ] && ! grep -q "chain done" "$R/chain.log" 2>/dev/null; do sleep 10; done
    cat "$R/chain.log"; cat "$R"/*.md 2>/dev/null; cp "$R"/*.md "$OUT/" 2>/dev/null; true
    ;;
esac
