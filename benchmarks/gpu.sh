#!/usr/bin/env bash
# The GPU benchmarks in one command, for the first session that gets a GPU (issue 14, section 3).
#
#   benchmarks/gpu.sh [OUT_DIR] [--dry-run]        # OUT_DIR defaults to gpu_out/
#
# Runs, each job in its own process so a failure (an OOM, an unsupported kernel) loses only
# itself and every result is written as soon as it exists:
#   1. bench_step.py: the 134M family at context 1024, bf16 compute, batch 32, depths 12,1,2,32
#      (L12 first: the MFU target), once per attention path (model.attention: dot_product =
#      jax.nn.dot_product_attention's default path, cudnn = its fused cuDNN kernel);
#   2. bench_act.py: the ACT base preset (d_model 768, M=24), batch 32, T=128;
#   3. bench_fusion.py: a BERT-base-shaped encoder (12 x 768), batch 32, T=128, 32 labelled;
#   4. bench_trials.py: K = 1, 2, 4, 8, 16 trials (--run.seeds 0,...,K-1) of the tiny-L2 and
#      small-L4 LMs against K solo steps, T=128, batch 32, grammar data (target: K=8 tiny
#      trials <= 3 x one solo step), and K = 5, 16 trials' evaluation vmapped against trial
#      by trial (trials.evaluation auto picks vmapped on a GPU: this checks that choice); in
#      its JSON, not in the merged report; its experiment parts, the few-shot grid and sweep
#      slice run both ways, are left to the CPU runs;
# then gpu_report.py merges the JSONs into OUT_DIR/gpu_results.json and gpu_results.md and
# prints the targets: MFU >= 45% for 134M-L12 (against the datasheet bf16 peak,
# jaxdepth.trainer.mfu.device_peak_flops) and compile(L32) <= 1.3 x compile(L1).
#
# Time: on an H200 (2026-11-26) XLA's GPU autotuning made each program's first compile take
# 30-70 s, so the 15 programs need about 20 minutes; with less, name GPU_SH_PARTS in order of need.
# Without a GPU visible to JAX it stops, unless --dry-run or GPU_SH_ALLOW_CPU=1: then it is a
# smoke run with tiny sizes (any device) that checks the whole pipeline writes both files.
# Environment: GPU_SH_PARTS (default "step act fusion trials"; the report always runs, so a session
# with a per-command time limit can run the parts in separate calls into the same OUT_DIR),
# GPU_SH_ATTENTIONS (default "dot_product cudnn"), GPU_SH_DEPTHS (default "12 1 2 32"),
# GPU_SH_BATCH (default 32), PYTHON (default python).
set -uo pipefail

OUT=gpu_out
SMOKE=${GPU_SH_ALLOW_CPU:-0}
for arg in "$@"; do
    case "$arg" in
        --dry-run) SMOKE=1 ;;
        -h|--help) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "gpu.sh: unknown option $arg" >&2; exit 2 ;;
        *) OUT=$arg ;;
    esac
done
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python}

backend=$($PY -c "import jax; print(jax.default_backend(), jax.devices()[0].device_kind, sep=': ')" 2>&1 | tail -1)
if [[ "$backend" != gpu* && "$SMOKE" != 1 ]]; then
    echo "gpu.sh: no GPU visible to JAX (backend $backend). Install jax with CUDA" \
         "(pip install -U 'jax[cuda12]') on a GPU machine, or pass --dry-run (or set" \
         "GPU_SH_ALLOW_CPU=1) for the CPU smoke run with tiny sizes." >&2
    exit 2
fi
mkdir -p "$OUT/logs" "$OUT/step" || exit 2
OUT=$(cd "$OUT" && pwd)
cd "$REPO" || exit 2
echo "gpu.sh: JAX backend $backend; results in $OUT"
command -v nvidia-smi >/dev/null && nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1

PARTS=${GPU_SH_PARTS:-step act fusion trials}
if [[ "$SMOKE" == 1 ]]; then  # tiny sizes; cudnn needs a GPU, so only the portable path
    ATTENTIONS=${GPU_SH_ATTENTIONS:-dot_product}
    DEPTHS=${GPU_SH_DEPTHS:-2 1}
    STEP_ARGS=(--family tiny --seq-len 32 --batch "${GPU_SH_BATCH:-4}" --steps 2 --warmup 1)
    ACT_ARGS=(--preset tiny --batch 2 --seq-len 16 --biases 8,-30 --repeats 2 --warmup 1)
    FUSION_ARGS=(--d-model 32 --layers 2 --heads 2 --seq-len 16 --batch 2 --labelled 4 --repeats 2)
    TRIALS_ARGS=(--quick --ks 1,2 --models tiny)
    REPORT_ARGS=(--mfu-depth 2 --compile-depths 1,2)
else
    ATTENTIONS=${GPU_SH_ATTENTIONS:-dot_product cudnn}
    DEPTHS=${GPU_SH_DEPTHS:-12 1 2 32}
    STEP_ARGS=(--family 134M --seq-len 1024 --batch "${GPU_SH_BATCH:-32}" --steps 10 --warmup 2)
    ACT_ARGS=(--preset base --batch 32 --seq-len 128)
    FUSION_ARGS=(--d-model 768 --layers 12 --heads 12 --seq-len 128 --batch 32 --labelled 32)
    TRIALS_ARGS=(--parts steps,eval --ks 1,2,4,8,16 --models tiny,small --steps 20 --eval-ks 5,16)
    REPORT_ARGS=(--mfu-depth 12 --compile-depths 1,32)
fi

# Each job: name, then the command. Its exit status goes to status.tsv (read by the report),
# its output to logs/NAME.log; a failed job is reported and the others still run.
STATUS="$OUT/status.tsv"
failed=0
job() {
    local name=$1; shift
    local t0=$SECONDS
    echo "== $name: $*"
    "$@" > "$OUT/logs/$name.log" 2>&1
    local rc=$?
    printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" >> "$STATUS"
    if [[ $rc != 0 ]]; then
        failed=1
        echo "   FAILED (exit $rc) after $((SECONDS - t0)) s; last lines of logs/$name.log:"
        tail -5 "$OUT/logs/$name.log" | sed 's/^/     /'
    else
        echo "   ok, $((SECONDS - t0)) s"
    fi
}

# The flags this script passes must exist (the scripts change): fail now, naming the flag.
check_flags() {
    local script=$1; shift
    local help
    help=$($PY "benchmarks/$script" --help 2>&1) || { echo "gpu.sh: $script --help failed:" >&2; echo "$help" >&2; exit 2; }
    for a in "$@"; do
        if [[ $a == --* && $help != *"$a"* ]]; then
            echo "gpu.sh: benchmarks/$script has no $a flag any more; update gpu.sh" >&2
            exit 2
        fi
    done
}

for part in $PARTS; do
    case $part in
        step)
            check_flags bench_step.py "${STEP_ARGS[@]}" --depths --dtype --attention --no-isolate --out
            for attn in $ATTENTIONS; do
                for L in $DEPTHS; do
                    # One process per member (--no-isolate within it): its memory peak and
                    # compile time are its own, and an OOM at L32 costs only L32.
                    job "step_${attn}_L$L" $PY benchmarks/bench_step.py "${STEP_ARGS[@]}" \
                        --depths "$L" --dtype bfloat16 --attention "$attn" --no-isolate \
                        --out "$OUT/step/${attn}_L$L.json"
                done
            done ;;
        act)
            check_flags bench_act.py "${ACT_ARGS[@]}" --out
            job act $PY benchmarks/bench_act.py "${ACT_ARGS[@]}" --out "$OUT/bench_act.json" ;;
        fusion)
            check_flags bench_fusion.py "${FUSION_ARGS[@]}" --out
            job fusion $PY benchmarks/bench_fusion.py "${FUSION_ARGS[@]}" --out "$OUT/bench_fusion.json" ;;
        trials)
            check_flags bench_trials.py "${TRIALS_ARGS[@]}" --out
            job trials $PY benchmarks/bench_trials.py "${TRIALS_ARGS[@]}" --out "$OUT/bench_trials.json" ;;
        *) echo "gpu.sh: unknown part '$part' in GPU_SH_PARTS (step, act, fusion, trials)" >&2; exit 2 ;;
    esac
done

mode=gpu
[[ "$SMOKE" == 1 ]] && mode=smoke
$PY benchmarks/gpu_report.py "$OUT" --mode "$mode" "${REPORT_ARGS[@]}" || exit 2
exit $failed
