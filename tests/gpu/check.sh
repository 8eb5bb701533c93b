#!/usr/bin/env bash
# The GPU check of sparsescale (docs/guide/gpu.md): at most 8 minutes on one H100 / H200.
#
#   1. installs the project (editable, no dependencies; wheels of what the image lacks from
#      .whl/, fetched beforehand with tests/gpu/fetch_wheels.sh);
#   2. runs the GPU tests (pytest -m gpu tests/gpu);
#   3. runs `sparsescale bench --device cuda` at B = 8, 64, 512, 4096 with 32 trials on mlp,
#      cnn1d, lee_cnn and resnet8, in fp32 (TF32 off), and at the end in tf32 for the time left;
#   4. runs the quickstart study on cuda, then lee_sparsity_mnist1d at paper scale for the
#      time left (a rerun into the same folder completes it), with their wall times;
#   5. prints a short table last; writes it to $OUT/summary.md and every log (the studies' stores
#      and reports too) into $OUT/logs.tar.gz, also when a phase fails or the budget runs out
#      (two files: the device tool brings back at most 8).
#
# Each phase has its own time limit inside one overall deadline (BUDGET seconds, default 460),
# so the script ends inside the device tool's 10-minute command limit whatever happens.
# PHASES (default all: gpu-tests bench-fp32 profile study-quickstart study-lee bench-tf32) runs
# only those named; BENCH_MODELS (default mlp,cnn1d,lee_cnn,resnet8) the bench's models;
# LIMIT_<phase, '-' as '_'> replaces a phase's own limit (LIMIT_study_quickstart=150);
# PROFILE_CELL (default "lee_cnn 64") the model and batch size the profile phase looks at.
set -u
START=$(date +%s)
BUDGET=${BUDGET:-460}
DEADLINE=$((START + BUDGET))
OUT=${OUT:-/tmp/sparsescale-gpu}
LOGS=${LOGS:-/tmp/sparsescale-gpu-logs}
mkdir -p "$OUT" "$LOGS"
pack() { tar -czf "$OUT/logs.tar.gz" -C "$LOGS" --exclude='*.pt' --exclude='*.npz' . 2>/dev/null; }
trap pack EXIT
cd "$(dirname "$0")/../.." || exit 1
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=/tmp/sparsescale-torch-ext MPLBACKEND=Agg
# the measured program choices and the generated data sets, kept with the logs
export SPARSESCALE_CACHE=${SPARSESCALE_CACHE:-$LOGS/cache}

left() { echo $((DEADLINE - $(date +%s))); }
# phase NAME MAX_SECONDS COMMAND...: run COMMAND with at most MAX_SECONDS (and never past the
# deadline), its output to $LOGS/NAME.log; records the status and the seconds it took
PHASES=${PHASES:-gpu-tests bench-fp32 profile study-quickstart study-lee bench-tf32}
phase() {
    local name=$1 max=$2; shift 2
    case " $PHASES " in *" $name "*) ;; *) return ;; esac
    local own="LIMIT_${name//-/_}"; max=${!own:-$max}   # e.g. LIMIT_study_quickstart=150
    local limit; limit=$(left)
    [ "$limit" -gt "$max" ] && limit=$max
    if [ "$limit" -le 5 ]; then echo "skipped: no time left" > "$LOGS/$name.log"; echo "$name skipped 0" >> "$LOGS/phases.txt"; return; fi
    local t0; t0=$(date +%s)
    echo "== $name (limit ${limit}s)"
    timeout --signal=INT --kill-after=10 "$limit" "$@" > "$LOGS/$name.log" 2>&1
    local rc=$?
    echo "$name $rc $(( $(date +%s) - t0 ))" >> "$LOGS/phases.txt"
    tail -n 3 "$LOGS/$name.log"
    pack   # what is done so far comes back even if the machine goes before the end
}
: > "$LOGS/phases.txt"

# 1. environment and install
{ nvidia-smi; $PY -c "import torch, sys; print(sys.version); print('torch', torch.__version__, 'CUDA', torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU')"; } > "$LOGS/environment.txt" 2>&1
if ls .whl/*.whl > /dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > "$LOGS/install.log" 2>&1
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# INSTALL=0: leave the Python environment alone (a dry run of this script off the GPU machine)
[ "${INSTALL:-1}" = 1 ] && { $PY -m pip install -q --no-index --no-deps --no-build-isolation -e . >> "$LOGS/install.log" 2>&1 \
    || echo "editable install failed (see install.log); the tree is on PYTHONPATH" >> "$LOGS/install.log"; }
$PY -c "import training, experiments, mnist1d" >> "$LOGS/install.log" 2>&1 \
    || { echo "the project cannot be imported: see install.log (carry .whl/: tests/gpu/fetch_wheels.sh)"; cat "$LOGS/install.log"; exit 1; }

# 2. the GPU tests
# (on pytest-xdist's workers where it is installed, as on the GPU image: the float64 CPU
# references are most of the time; -rP keeps each test's printed numbers)
XDIST=$($PY -c "import xdist" 2>/dev/null && echo "-n 8")
phase gpu-tests 150 env OMP_NUM_THREADS=2 $PY -m pytest -m gpu tests/gpu -q -rs -rP $XDIST -p no:cacheprovider --durations=12 \
    --tb=short --junitxml="$LOGS/gpu-tests.xml"

# 3. the benchmark on the GPU: fp32 (TF32 off), then tf32
BENCH=(--models "${BENCH_MODELS:-mlp,cnn1d,lee_cnn,resnet8}" --batch-sizes 8,64,512,4096 --trials 32 --seconds 0.5)
phase bench-fp32 130 $PY -m experiments.cli bench --device cuda --precision fp32 "${BENCH[@]}"

# where a cell's step spends its time (default lee_cnn at B = 64: the plain loop, the vectorized trainer, the
# host operations and waits)
phase profile 40 $PY tests/gpu/profile_step.py ${PROFILE_CELL:-lee_cnn 64}

# 4. studies on the GPU, timed (lee_sparsity_mnist1d for at most 150 s: a rerun into the same
#    folder goes on from there). A study folder brought back by an earlier check (its logs
#    archive's runs/NAME) and carried under .gpu-runs/NAME (git-ignored) is continued.
[ -d .gpu-runs ] && mkdir -p "$LOGS/runs" && cp -r .gpu-runs/. "$LOGS/runs/"
STUDY=(--device cuda --quiet --no-cost-model)
phase study-quickstart 60 $PY -m experiments.cli study quickstart --out "$LOGS/runs/quickstart" "${STUDY[@]}"
phase study-lee 150 $PY -m experiments.cli study lee_sparsity_mnist1d --out "$LOGS/runs/lee_sparsity_mnist1d" --no-report "${STUDY[@]}"

# 5. the benchmark in tf32 for the time left
phase bench-tf32 90 $PY -m experiments.cli bench --device cuda --precision tf32 "${BENCH[@]}"

# 6. the table
$PY tests/gpu/summary.py "$LOGS" | tee "$OUT/summary.md"
echo "total $(( $(date +%s) - START )) s; logs in $OUT/logs.tar.gz"
