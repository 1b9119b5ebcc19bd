#!/usr/bin/env bash
# One call on the GPU machine (device tool), everything written into $OUT as it is produced.
#   PART=tests : every cuda-marked test, spread over $WORKERS pytest-xdist processes on the one GPU
#                (correctness only: no test asserts a time), junit + log in $OUT.
#   PART=bench : `libreyolo bench` for $BENCH (model:imgsz[:batch]) and benchmarks/train_step.py for
#                $TRAIN (model:imgsz:batch), one process each, JSON bundled into $OUT/json.tgz.
#   PART=train : issue 16's whole runs: the 30-epoch `libreyolo train --cuda-graph` process timed
#                (and again with gpu_augment=true), benchmarks/train_epochs.py's host levers
#                ($LOOP_ARMS: graph, graph+switch, graph+overlap; 30 epochs) and the 20-epoch run eager vs graph on a
#                generated set of $N_TRAIN (2000) images; results.csv files and JSON into $OUT.
#   PART=big   : that last run alone (one process and JSON per arm: a timed-out arm keeps the other's;
#                $BIG_ARMS picks them, default "graph eager"; the eager arm needs T_BIG=400).
#   PART=cli   : the first of PART=train alone: the 30-epoch CLI process for each arm of $CLI_ARMS
#                (plain gpu_augment nofreeze nopool switch noswitch threadwrite; an arm named twice runs again, the machine then warm;
#                nofreeze: freeze_heap=false, the garbage collector as by Python's default;
#                nopool: eval_processes=0, every evaluation in the trainer's process;
#                switch / noswitch: switch_interval=$SWITCH (default 1e-4 s) / unset, Python's 5 ms;
#                threadwrite: checkpoint_process=false, the writer thread pickles the checkpoints).
#   PART=quality : gpu_augment's accuracy against the CPU recipe's: the 30-epoch CLI run of PART=train for
#                the arms of $ARMS (plain gpu_augment gpu_augment_local: the last with batch-local
#                mosaic partners, DeviceAugment's POOL_IMAGES=0) under each seed of $SEEDS (0 1 2),
#                results.csv per arm and seed into $OUT, and each run's final mAP50-95 in
#                $OUT/quality.log (one run per arm cannot tell them apart).
#   PART=profile : the 30-epoch CLI process under cProfile and -X importtime
#                (scripts/profile_train_cli.py): where its wall goes outside the epochs.
#   PART=gen   : benchmarks/builtin_sets.py: the 2000 + 200 shapes set at 640 generated with each worker
#                count of $GEN_ARMS (16 1), a fresh process and JSON line per arm.
#   PART=snapshot : benchmarks/checkpoint_snapshot.py: an epoch's checkpoint snapshot per tensor vs
#                packed, and benchmarks/capture_restore.py: a capture's save and restore of the whole
#                step's state per tensor vs FlatCopy; alone and beside a busy Python thread
#                (yolo9-t, channels_last), JSON in $OUT.
#   K          : PART=tests only runs the tests whose names match this pytest -k expression.
# Wheels missing on the machine travel in .whl (carry it).
set -uo pipefail
OUT="${OUT:-.out}"; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
J=/tmp/json; mkdir -p "$J"; pack() { tar czf "$OUT/json.tgz" -C "$J" . 2>/dev/null; }
big() {   # 20 epochs eager vs graph on a generated set of $N_TRAIN images, one process and JSON per arm
  export LIBREYOLO_DATASETS_DIR="${LIBREYOLO_DATASETS_DIR:-/tmp/ds}"
  python3 -c "from libreyolo.data.synthetic import make_shapes_dataset as m; n=${N_TRAIN:-2000}; \
print(m(n_train=n, n_val=max(64, n // 10), imgsz=640))" >> "$OUT/train.log" 2>&1
  for arm in ${BIG_ARMS:-graph eager}; do
    timeout "${T_BIG:-200}" python3 benchmarks/train_epochs.py --arm "$arm" --epochs "${BIG_EPOCHS:-20}" --imgsz 320 \
      --batch 16 --workers 8 --amp true --n-train "${N_TRAIN:-2000}" > "$J/big-$arm.json" 2>> "$OUT/train.log"
    echo "big $arm rc=$?" >> "$OUT/train.log"; pack
  done
}
cli() {   # the 30-epoch CLI process timed for each arm of $CLI_ARMS, a fresh process each
  export LIBREYOLO_DATASETS_DIR="${LIBREYOLO_DATASETS_DIR:-/tmp/ds}"
  python3 -c "from libreyolo.data.datasets import resolve_data; resolve_data('shapes')" > "$OUT/train.log" 2>&1
  TIMEFORMAT='process wall %R s'
  local i=0
  # a fresh process each, from interpreter start to its exit; entry() as the libreyolo program
  # (the console script, python -m libreyolo.cli): it ends without the interpreter's teardown
  for arm in ${CLI_ARMS:-plain gpu_augment}; do
    extra=""; [ "$arm" = gpu_augment ] && extra="gpu_augment=true"   # the arms' tune options:
    [ "$arm" = nofreeze ] && extra="freeze_heap=false"
    [ "$arm" = nopool ] && extra="eval_processes=0"
    [ "$arm" = switch ] && extra="switch_interval=${SWITCH:-1e-4}"
    [ "$arm" = threadwrite ] && extra="checkpoint_process=false"
    i=$((i + 1)); [ -e "$OUT/train-cli-$arm.log" ] && arm="$arm-$i"   # an arm named twice: cold, then warm
    { time timeout "${T_CLI:-100}" python3 -c "from libreyolo.cli import entry; entry()" train model=yolo9t data=shapes epochs=30 batch=16 \
        imgsz=320 cuda_graph=true project=/tmp/runs name="cli-$arm" exist_ok=true $extra \
        > "$OUT/train-cli-$arm.log" 2>&1; echo "cli $arm rc=$?" >> "$OUT/train-cli-$arm.log"; } 2>> "$OUT/train-cli-$arm.log"
    cp "/tmp/runs/cli-$arm/results.csv" "$OUT/train-cli-$arm.csv" 2>/dev/null
    tail -2 "$OUT/train-cli-$arm.log" >> "$OUT/train.log"
  done
}
python3 -c "import torch, torchvision; print(torch.__version__, torchvision.__version__, torch.cuda.get_device_name(0))" > "$OUT/env.txt" 2>&1
case "${PART:-tests}" in
tests)
  # the built-in sets are generated once, here, before xdist workers could race to write them
  python3 -c "
from libreyolo.tasks import TASKS
for task, data in (('detect', 'shapes'), ('classify', 'shapes-cls'), ('semantic', 'shapes-seg')):
    if task in TASKS:
        TASKS[task].resolve_data(data)
" >> "$OUT/gpu-tests.log" 2>&1
  timeout "${T:-540}" python3 -m pytest -m cuda ${TESTS:-tests} -q -p no:cacheprovider -rf --tb=short --timeout=240 \
    ${K:+-k "$K"} -n "${WORKERS:-3}" --durations=20 --junitxml="$OUT/gpu-tests.xml" > "$OUT/gpu-tests.log" 2>&1
  echo "tests rc=$?" >> "$OUT/gpu-tests.log"; tail -40 "$OUT/gpu-tests.log";;
bench)
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-8}"
  for spec in ${BENCH:-}; do
    IFS=: read -r m sz b <<< "$spec"
    timeout 60 python3 -m libreyolo.cli bench model="$m" imgsz="$sz" batch="${b:-1}" runs="${RUNS:-150}" \
      json="$J/bench-$m-$sz-b${b:-1}.json" >> "$OUT/bench.log" 2>&1; echo "bench $spec rc=$?" >> "$OUT/bench.log"; pack
  done
  for spec in ${TRAIN:-}; do
    IFS=: read -r m sz b <<< "$spec"
    timeout 90 python3 benchmarks/train_step.py --all --arms eager,whole --model "$m" --batch "$b" --imgsz "$sz" --amp \
      --runs "${TRAIN_RUNS:-30}" --warmup 5 --json "$J/train-$m-$sz-b$b.json" >> "$OUT/train.log" 2>&1
    echo "train $spec rc=$?" >> "$OUT/train.log"; pack
  done
  grep -h "median\|speedup\|rc=\|predict_graph\b\|forward_graph\b" "$OUT"/*.log | tail -60;;
train)
  cli
  timeout "${T_LOOP:-170}" python3 benchmarks/train_epochs.py --arms "${LOOP_ARMS:-graph,graph+switch,graph+overlap}" --epochs 30 --imgsz 320 \
    --batch 16 --workers 8 --amp true --json "$J/loop.json" >> "$OUT/train.log" 2>&1; echo "loop rc=$?" >> "$OUT/train.log"; pack
  big; tail -30 "$OUT/train.log";;
big) big; tail -30 "$OUT/train.log";;
cli) cli; tail -30 "$OUT/train.log";;
snapshot)
  # the per-tensor arms beside the busy thread take tens of seconds a call: few runs
  timeout "${T_SNAP:-150}" python3 benchmarks/checkpoint_snapshot.py --channels-last --busy --runs "${RUNS:-1}" \
    --json "$OUT/checkpoint-snapshot.json" > "$OUT/snapshot.log" 2>&1
  echo "snapshot rc=$?" >> "$OUT/snapshot.log"
  timeout "${T_SNAP:-150}" python3 benchmarks/capture_restore.py --channels-last --busy --runs "${RUNS:-1}" \
    --json "$OUT/capture-restore.json" >> "$OUT/snapshot.log" 2>&1
  echo "capture_restore rc=$?" >> "$OUT/snapshot.log"; cat "$OUT/snapshot.log";;
gen)
  timeout "${T_GEN:-400}" python3 benchmarks/builtin_sets.py --n-train 2000 --n-val 200 --imgsz 640 \
    --workers ${GEN_ARMS:-16 1} > "$J/builtin_sets.jsonl" 2> "$OUT/gen.log"
  echo "gen rc=$?" >> "$OUT/gen.log"; cat "$J/builtin_sets.jsonl" "$OUT/gen.log";;
quality)
  export LIBREYOLO_DATASETS_DIR="${LIBREYOLO_DATASETS_DIR:-/tmp/ds}"
  python3 -c "from libreyolo.data.datasets import resolve_data; resolve_data('shapes')" > "$OUT/quality.log" 2>&1
  for seed in ${SEEDS:-0 1 2}; do
    for arm in ${ARMS:-plain gpu_augment gpu_augment_local}; do
      extra=""; [ "$arm" != plain ] && extra="gpu_augment=true"
      pool=""; [ "$arm" = gpu_augment_local ] && pool="g.POOL_IMAGES = 0"
      timeout "${T_CLI:-100}" python3 -c "import sys; import libreyolo.data.gpu_augment as g; $pool
from libreyolo.cli import entry; entry()" train model=yolo9t data=shapes epochs=30 batch=16 imgsz=320 \
        cuda_graph=true seed="$seed" project=/tmp/runs name="q-$arm-$seed" exist_ok=true $extra \
        > "$OUT/quality-$arm-$seed.log" 2>&1
      echo "quality $arm seed=$seed rc=$?" >> "$OUT/quality.log"
      cp "/tmp/runs/q-$arm-$seed/results.csv" "$OUT/quality-$arm-$seed.csv" 2>/dev/null \
        && tail -1 "$OUT/quality-$arm-$seed.csv" | awk -F, -v a="$arm" -v s="$seed" \
          '{print "final mAP50-95", a, "seed", s, $11}' >> "$OUT/quality.log"
    done
  done
  cat "$OUT/quality.log";;
profile)
  # where the 30-epoch CLI process spends its wall outside the epochs: cProfile + -X importtime
  export LIBREYOLO_DATASETS_DIR="${LIBREYOLO_DATASETS_DIR:-/tmp/ds}"
  python3 -c "from libreyolo.data.datasets import resolve_data; resolve_data('shapes')" > "$OUT/profile.log" 2>&1
  TIMEFORMAT='process wall %R s'
  { time timeout "${T_CLI:-100}" python3 -X importtime scripts/profile_train_cli.py --prof "$OUT/train-cli.prof" \
      --top 120 -- train model=yolo9t data=shapes epochs=30 batch=16 imgsz=320 cuda_graph=true project=/tmp/runs \
      name=profile exist_ok=true > "$OUT/profile.log" 2> "$OUT/profile-stderr.log"; } 2>> "$OUT/profile.log"
  grep -h "profile_train_cli\|process wall" "$OUT/profile.log";;
esac
pack
