#!/usr/bin/env bash
# GPU check: one prepared script for a borrowed machine with one GPU (about 8 minutes).
#
#   bash benchmarks/gpu_check.sh --out DIR              # on the GPU machine
#   bash benchmarks/gpu_check.sh --device cpu --quick   # the same steps, tiny, on a CPU
#
# Steps (each prints progress prefixed [step]; its log is DIR/logs/STEP.log):
#   data     unpack the CIFAR-10 JPEG archive into a temp folder and decode it once
#            (in the background while step a runs; skipped with --data-dir, and in --quick
#            without --data-dir/--data-archive, where step c uses the synthetic task)
#   a        benchmarks/round_time.py: lenet-cifar and resnet20, FedAvg and FedMut, backends
#            loop, vmap, compiled, graphs (CUDA graphs), 5 seeds stacked -> DIR/a_round_time.md
#   b        the vmap/stacked/compiled-vs-loop equality tests (tests/test_vmap.py,
#            tests/test_train_stacked.py, tests/test_seeds.py) with FLNOTES_TEST_DEVICE set
#            to the device -> DIR/b_equality_tests.md
#   c        the committed evidence cell dir=0.1 FedQP seed 0 (results/cifar10-lenet), 200
#            rounds on the device -> DIR/c_cell_run/ (runs beside step b, after step a)
#   d        step c's run against the committed CPU run, round by round -> DIR/d_compare.md
# A failed or timed-out step does not stop the others; the script ends with one line per
# step (also DIR/summary.md) and exits 1 if any step failed.
#
# Options: --device D (default cuda if torch sees one, else cpu), --out DIR (default: a new
# temp folder; also $OUT), --quick, --data-dir DIR (a CIFAR-10 image folder: train/, test/),
# --data-archive FILE (default: $FLNOTES_CIFAR_ARCHIVE, .device-data/, shared/datasets/ or
# /work/shared/datasets/ cifar10-jpeg.tar.xz), --timings-limit S (step a, default 250),
# --checks-limit S (steps b and c each, default 190). Never commit the data or DIR.

set -u

usage() { sed -n '2,/^$/p' "$0" | sed 's/^# \{0,1\}//'; }

DEVICE=""
QUICK=0
OUT_DIR="${OUT:-}"
DATA_DIR=""
DATA_ARCHIVE="${FLNOTES_CIFAR_ARCHIVE:-}"
TIMINGS_LIMIT=250
CHECKS_LIMIT=190
while [ $# -gt 0 ]; do
    case "$1" in
        --device) DEVICE="${2:?--device needs a value}"; shift 2 ;;
        --out) OUT_DIR="${2:?--out needs a folder}"; shift 2 ;;
        --quick) QUICK=1; shift ;;
        --data-dir) DATA_DIR="${2:?--data-dir needs a folder}"; shift 2 ;;
        --data-archive) DATA_ARCHIVE="${2:?--data-archive needs a file}"; shift 2 ;;
        --timings-limit) TIMINGS_LIMIT="${2:?}"; shift 2 ;;
        --checks-limit) CHECKS_LIMIT="${2:?}"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "gpu_check.sh: error: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
done

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO" || exit 2
PY="${PYTHON:-python}"
export PYTHONUNBUFFERED=1
START=$SECONDS

if [ -z "$DEVICE" ]; then
    DEVICE="$("$PY" -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')" \
        || { echo "gpu_check.sh: error: cannot import torch with $PY" >&2; exit 2; }
fi
if [ -z "$OUT_DIR" ]; then
    OUT_DIR="$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")"
fi
mkdir -p "$OUT_DIR/logs" "$OUT_DIR/status" || exit 2
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
rm -f "$OUT_DIR"/status/*
WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu-check-work.XXXXXX")" || exit 2
trap 'rm -rf "$WORK"' EXIT
# A fresh compile cache: the warm-up column of step a includes compilation every time.
export TORCHINDUCTOR_CACHE_DIR="$WORK/inductor"

CELLS="results/cifar10-lenet/cells"
CELL=""
for d in "$CELLS"/dir=0.1_FedQP_seed0-*/runs/fedqp/seed0; do
    [ -f "$d/metrics.jsonl" ] && [ -z "$CELL" ] && CELL="$d"
done
SCALE=""
for f in "$CELLS"/dir=0.1_FedQP_seed1-*/runs/fedqp/seed1/metrics.jsonl; do
    [ -f "$f" ] && [ -z "$SCALE" ] && SCALE="$f"
done

# Where step c's data come from: a folder, an archive to unpack, or (quick only) none.
USE_CIFAR=1
if [ -z "$DATA_DIR" ] && [ -z "$DATA_ARCHIVE" ]; then
    if [ "$QUICK" = 1 ]; then
        USE_CIFAR=0
    else
        for f in "$REPO/.device-data/cifar10-jpeg.tar.xz" \
                 "$REPO/shared/datasets/cifar10-jpeg.tar.xz" \
                 /work/shared/datasets/cifar10-jpeg.tar.xz; do
            [ -f "$f" ] && { DATA_ARCHIVE="$f"; break; }
        done
    fi
fi

if [ "$QUICK" = 1 ]; then
    # Tiny: 2 seeds x 2 clients x 1 step, in one process; no compiled backends on a CPU
    # (torch.compile takes minutes there).
    TIMING_ARGS=(--seeds 2 --clients 2 --samples 10 --batch-size 10 --epochs 1 --rounds 1
                 --in-process)
    case "$DEVICE" in cuda*) BACKENDS=loop,vmap,compiled,graphs ;; *) BACKENDS=loop,vmap ;; esac
    TESTS=(tests/test_vmap.py -k "test_vmap_equals_loop_per_client_in_float32 and resnet20")
    CELL_ARGS=(--rounds 2 --eval-every 1)
else
    TIMING_ARGS=(--seeds 5 --rounds 1)
    BACKENDS=loop,vmap,compiled,graphs
    TESTS=(tests/test_vmap.py tests/test_train_stacked.py tests/test_seeds.py)
    # Four pytest workers when pytest-xdist is there (the compiled-step tests compile on CPU).
    "$PY" -c 'import xdist' 2>/dev/null && TESTS+=(-n 4)
    CELL_ARGS=()
fi
[ "$USE_CIFAR" = 0 ] && CELL_ARGS+=(--synthetic)

echo "gpu_check: device $DEVICE, quick $QUICK, out $OUT_DIR"
{
    echo "# GPU check, $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "- code: $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
    echo "- device: $DEVICE; quick: $QUICK; host: $(hostname), $(getconf _NPROCESSORS_ONLN) CPUs"
    command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | sed 's/^/- /'
    "$PY" -c 'import torch; print(f"- torch {torch.__version__}, CUDA {torch.version.cuda}")' 2>/dev/null
} > "$OUT_DIR/environment.md"
cat "$OUT_DIR/environment.md"

# run_step NAME LIMIT_S COMMAND...: log to logs/NAME.log and the console (prefixed),
# record "rc seconds" in status/NAME. Exit 124/137 from timeout means it ran too long.
run_step() {
    local name="$1" limit="$2" tic=$SECONDS rc
    shift 2
    echo "[$name] start: $*"
    timeout -k 10 "$limit" "$@" 2>&1 | tee "$OUT_DIR/logs/$name.log" | sed -u "s/^/[$name] /"
    rc=${PIPESTATUS[0]}
    echo "$rc $((SECONDS - tic)) $limit" > "$OUT_DIR/status/$name"
    echo "[$name] end: exit $rc after $((SECONDS - tic)) s"
    return 0
}

prepare_data() {
    if [ -n "$DATA_DIR" ]; then
        [ -d "$DATA_DIR/train" ] && [ -d "$DATA_DIR/test" ] && { echo "using $DATA_DIR"; return 0; }
        echo "error: --data-dir $DATA_DIR has no train/ and test/ folders"; return 1
    fi
    if [ -z "$DATA_ARCHIVE" ] || [ ! -f "$DATA_ARCHIVE" ]; then
        echo "error: no CIFAR-10 archive (cifar10-jpeg.tar.xz): give --data-dir or --data-archive"
        return 1
    fi
    echo "sha256 $(sha256sum "$DATA_ARCHIVE" | cut -c1-64) $DATA_ARCHIVE"
    mkdir -p "$WORK/cifar10" && tar -xJf "$DATA_ARCHIVE" -C "$WORK/cifar10" || return 1
    echo "unpacked into $WORK/cifar10: $(find "$WORK/cifar10" -name '*.jpg' | wc -l) images"
    # Decode once into the run's cache, so step c does not (flnotes caches decoded folders).
    TQDM_DISABLE=1 "$PY" -c 'import sys; from pathlib import Path; sys.path.insert(0, ".")
from flnotes.data.vision import load_image_folder
d = load_image_folder(Path(sys.argv[1]))
print("decoded", tuple(d["train_x"].shape), tuple(d["test_x"].shape))' "$WORK/cifar10"
}

export DEVICE OUT_DIR PY WORK CELL CELLS SCALE USE_CIFAR DATA_DIR DATA_ARCHIVE
export -f prepare_data
CELL_DATA=""
DATA_PID=""
if [ "$USE_CIFAR" = 1 ]; then
    if [ -z "$DATA_DIR" ]; then
        export FLNOTES_CACHE="$WORK/cache"  # decoded copy of the temp folder, removed at exit
        CELL_DATA="$WORK/cifar10"
    else
        CELL_DATA="$DATA_DIR"
    fi
    export CELL_DATA
    run_step data 600 bash -c prepare_data &
    DATA_PID=$!
fi

# a: seconds per round (alone on the device but for the data step's unpacking on one core).
run_step a "$TIMINGS_LIMIT" "$PY" benchmarks/round_time.py --device "$DEVICE" \
    --models lenet-cifar,resnet20 --algorithm fedavg,fedmut --backends "$BACKENDS" \
    "${TIMING_ARGS[@]}" --table "$OUT_DIR/a_round_time.md"

# b and c side by side: neither is a timing.
(
    export FLNOTES_TEST_DEVICE="$DEVICE"
    run_step b "$CHECKS_LIMIT" "$PY" -m pytest "${TESTS[@]}" -q -p no:cacheprovider \
        --junitxml "$OUT_DIR/logs/b_junit.xml"
) &
B_PID=$!
cell_step() {  # (a function run by a child bash under timeout: its arguments, exported names)
    if [ -z "$CELL" ]; then
        echo "error: no committed run under $CELLS/dir=0.1_FedQP_seed0-*/runs/fedqp/seed0"
        return 1
    fi
    if [ "$USE_CIFAR" = 1 ]; then
        read -r rc _ < "$OUT_DIR/status/data" || rc=missing
        [ "$rc" = 0 ] || { echo "error: the data step failed (logs/data.log)"; return 1; }
        set -- --data-dir "$CELL_DATA" "$@"
    fi
    rm -rf "$OUT_DIR/c_cell_run"
    "$PY" benchmarks/gpu_compare.py run "$CELL" --device "$DEVICE" --out "$OUT_DIR/c_cell_run" "$@"
}
export -f cell_step
if [ -n "$DATA_PID" ]; then
    echo "[c] waiting for the data step"
    wait "$DATA_PID"
fi
run_step c "$CHECKS_LIMIT" bash -c 'cell_step "$@"' cell_step "${CELL_ARGS[@]}"
wait "$B_PID"
if [ -f "$OUT_DIR/logs/b_junit.xml" ]; then
    "$PY" benchmarks/gpu_compare.py tests "$OUT_DIR/logs/b_junit.xml" \
        --table "$OUT_DIR/b_equality_tests.md" --note "FLNOTES_TEST_DEVICE=$DEVICE" >/dev/null
fi

# d: whatever step c wrote, against the committed CPU run.
compare_step() {
    [ -n "$CELL" ] || { echo "error: no committed run to compare with"; return 1; }
    [ -s "$OUT_DIR/c_cell_run/metrics.jsonl" ] || { echo "error: step c wrote no metrics"; return 1; }
    local note="" scale=()
    [ "$USE_CIFAR" = 0 ] && note="Quick check on the synthetic task: this only exercises the step; the numbers are not comparable."
    [ -n "$SCALE" ] && scale=(--scale "$SCALE")
    "$PY" benchmarks/gpu_compare.py compare "$CELL/metrics.jsonl" \
        "$OUT_DIR/c_cell_run/metrics.jsonl" --labels "CPU (committed),$DEVICE" \
        --note "$note" "${scale[@]}" --table "$OUT_DIR/d_compare.md"
}
export -f compare_step
run_step d 60 bash -c compare_step

# One line per step.
{
    echo "# GPU check summary ($DEVICE, quick $QUICK, $((SECONDS - START)) s in all)"
    echo
    for pair in "data:data (CIFAR-10 folder)" "a:a round_time.py -> a_round_time.md" \
                "b:b equality tests -> b_equality_tests.md" "c:c evidence cell run -> c_cell_run/" \
                "d:d CPU vs $DEVICE, round by round -> d_compare.md"; do
        name="${pair%%:*}"
        what="${pair#*:}"
        if [ ! -f "$OUT_DIR/status/$name" ]; then
            [ "$name" = data ] && { echo "- $what: skipped"; continue; }
            echo "- $what: FAILED (did not run)"
            continue
        fi
        read -r rc secs limit < "$OUT_DIR/status/$name"
        case "$rc" in
            0) echo "- $what: ok in ${secs} s" ;;
            124|137) echo "- $what: FAILED, timed out after ${limit} s (logs/$name.log)" ;;
            *) echo "- $what: FAILED, exit $rc after ${secs} s: $(grep -v '^\s*$' "$OUT_DIR/logs/$name.log" | tail -1 | cut -c1-200)" ;;
        esac
    done
} > "$OUT_DIR/summary.md"
echo
cat "$OUT_DIR/summary.md"
echo "tables and logs: $OUT_DIR"
grep -q FAILED "$OUT_DIR/summary.md" && exit 1
exit 0
