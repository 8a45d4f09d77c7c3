#!/bin/bash
# The GPU issue's checks in one call on a lent GPU machine (Python 3.12 with CUDA PyTorch, no
# package index), results under $OUT.
#
#   bench/gpu_session.sh wheels   here, once: the wheels that machine lacks, into .whl/ (ignored)
#   bench/gpu_session.sh run      there, in the repository root, with .whl carried
#   bench/gpu_session.sh table    there, likewise: Table 1 (bench.paper_table --gpu) alone, each
#                                 case measured over SECONDS_PER_CASE (default 120) after WARMUP
#                                 (30), QUICK=1 to allow a window under two minutes;
#                                 docs/benchmarks/paper_table.md with its section comes back in $OUT;
#                                 then VARIANTS (space-separated KEY=VALUE, default none), each
#                                 sfbus's training on VARIANT_GAME (doom_benchmark) over
#                                 VARIANT_SECONDS (20); GAMES limits the table to some games
#                                 (bench.paper_table --games); PROFILE=1 profiles the first
#                                 sfbus training case as `run` does (py-spy, ~0.3 cores of 16)
#
# Everything printed goes to $OUT/session.txt too; the CUDA tests' log is $OUT/tests.txt, py-spy's
# profiles of the training case $OUT/profile-{inference,learner,rollout.0}.txt (raw format).
# Knobs for a partial rerun: CASES (bench.throughput's, default train,sf_train,sim,sim_short),
# GAME (its env, default doom_basic), WORKERS (default 16), VARIANTS (space-separated KEY=VALUE,
# each a training case of its own, e.g. processes.inference.replicas=2; default: eager inference
# passes instead of CUDA graphs, "none" for none), SKIP_TESTS=1 (no CUDA tests, no inference
# pass timings), SKIP_LEARNING=1, GPU= (the CPU layout, to try it on a CPU).
#
# sfbus's wheels go to /tmp/site, Sample Factory's to /tmp/sfsite, which comes first on its own
# path only: it needs gymnasium 0.29 and numpy<2 (it caps both itself; numpy 2 kills its rollout
# workers at the first action), sfbus gymnasium 1.x and the machine's numpy 2.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_session}
mkdir -p "$OUT"

download() {  # download DIR SPEC...: CPython 3.12 manylinux wheels, no dependencies
    local dir=$1; shift
    for spec in "$@"; do
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
            --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
            --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 \
            --platform manylinux1_x86_64 -d "$dir" "$spec" || exit 1
    done
}

if [ "${1:-}" = wheels ]; then
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
    download .whl pyzmq==27.3.0 msgspec==0.22.0 vizdoom==1.3.2 gymnasium==1.4.0 \
        farama-notifications==0.0.6 cloudpickle==3.1.2 pytest-asyncio==1.5.0 py-spy==0.4.3 \
        ale-py==0.12.1
    download .whl/sf sample-factory==2.1.1 signal-slot-mp==1.0.5 faster-fifo==1.5.2 \
        gymnasium==0.29.1 tensorboardx==2.6.5 colorlog==6.12.0 numpy==1.26.4 ale-py==0.9.1
    # The call carries 64 MiB at most: drop the WADs no benchmarked scenario opens (doom_basic
    # runs on freedoom2; freedm and dwango5 are Sample Factory's deathmatch maps).
    zip -q -d .whl/vizdoom-*.whl vizdoom/freedoom1.wad
    zip -q -d .whl/sf/sample_factory-*.whl 'sf_examples/vizdoom/doom/scenarios/freedm.wad' \
        'sf_examples/vizdoom/doom/scenarios/dwango5.wad'
    du -sh .whl
    exit 0
fi
case "${1:-}" in run|table) ;; *) echo "usage: $0 wheels|run|table" >&2; exit 2 ;; esac

pip_target() {
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$@" || exit 1
}
pip_target /tmp/site .whl/*.whl
pip_target /tmp/sfsite .whl/sf/*.whl
# sfbus finds Sample Factory's VizDoom scenarios (doom_benchmark's battle.cfg) in its package
pip_target /tmp/site .whl/sf/sample_factory-*.whl
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
printf '#!/bin/sh\nPYTHONPATH=/tmp/sfsite:/tmp/site exec python3 "$@"\n' > /tmp/sfpython
chmod +x /tmp/sfpython
export SFBUS_BENCH_SF_PYTHON=/tmp/sfpython

exec > >(tee "$OUT/session.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
lscpu | grep -E '^(Model name|CPU\(s\))'; python3 -c 'import torch; print(torch.__version__)'

child() {  # the pid of the run's child process named $1 (not of a shell that names it)
    pgrep -f "^[^ ]*python[0-9.]* -m sfbus.child [^ ]* $1( |\$)" | head -1
}

profile() {  # py-spy on the first sfbus training case's inference, learner and first rollout
    local bench=$1 inference=""  # processes, 8 s each from PROFILE_DELAY (25) s after they
    # start, unless the benchmark (pid $1) ends first
    while [ -z "$inference" ]; do
        kill -0 "$bench" 2>/dev/null || return
        sleep 1
        inference=$(child inference)
    done
    sleep "${PROFILE_DELAY:-25}"
    local spies=()
    for name in inference learner rollout.0; do
        py-spy record --nonblocking -r 200 -d 8 -f raw -o "$OUT/profile-$name.txt" \
            -p "$(child $name)" > "/tmp/py-spy-$name.log" 2>&1 &
        spies+=($!)
    done
    wait "${spies[@]}"
    tail -n 2 /tmp/py-spy-*.log
}

if [ "$1" = table ]; then
    echo "== Table 1"
    (timeout "${TABLE_TIMEOUT:-3000}" python3 -m bench.paper_table --gpu --write-docs \
        --seconds "${SECONDS_PER_CASE:-120}" --warmup "${WARMUP:-30}" ${QUICK:+--quick} \
        ${GAMES:+--games "$GAMES"} 2>&1) &
    table=$!
    [ -n "${PROFILE:-}" ] && profile $table
    wait $table
    status=$?
    cp docs/benchmarks/paper_table.md "$OUT/paper_table.md"
    for variant in ${VARIANTS:-}; do  # sfbus's training on one game with one override each
        echo "== ${VARIANT_GAME:-doom_benchmark} training with $variant"
        timeout 200 python3 -m bench.throughput --gpu --env "${VARIANT_GAME:-doom_benchmark}" \
            --cases train --set "$variant" --workers "${WORKERS:-16}" --envs 16 \
            --seconds "${VARIANT_SECONDS:-20}" --warmup "${WARMUP:-30}" 2>&1
    done
    exit $status
fi

if [ -z "${SKIP_TESTS:-}" ]; then
    echo "== CUDA tests"
    timeout 240 python3 -m pytest -q -rs -p no:cacheprovider tests/components/models/test_devices.py \
        tests/components/models/test_graphed_step.py tests/components/sampling/test_inference.py \
        tests/components/learning/test_learner.py tests/components/learning/test_training_state.py \
        > "$OUT/tests.txt" 2>&1
    tail -n 12 "$OUT/tests.txt"

    echo "== inference passes, eager and from CUDA graphs"
    timeout 90 python3 -m bench.gpu_inference --repeats 20 --rows 8,32,128,512 2>&1
fi

echo "== throughput"
cases=${CASES:-train,sf_train,sim,sim_short}
(timeout 420 python3 -m bench.throughput ${GPU---gpu} --env "${GAME:-doom_basic}" \
    --cases "$cases" --workers "${WORKERS:-16}" --envs 16 --seconds 15 --warmup 8 2>&1) &
bench=$!
profile $bench
wait $bench
variants=${VARIANTS:-processes.inference.actors.inference.params.cuda_graphs=false}
[ "$variants" = none ] && variants=""
for variant in $variants; do
    echo "== training with $variant"
    timeout 200 python3 -m bench.throughput ${GPU---gpu} --env "${GAME:-doom_basic}" --cases train \
        --set "$variant" --workers "${WORKERS:-16}" --envs 16 --seconds 15 --warmup 8 2>&1
done

if [ -z "${SKIP_LEARNING:-}" ]; then
    echo "== learning"
    timeout 150 python3 -m bench.learning --frames 1000000 \
        --config gpu_seed0@topologies/doom_basic_gpu.yaml=seed=0 2>&1
fi
