#!/usr/bin/env bash
# The GPU benchmarks in one command, for the first session that gets a GPU (issue 14, section 3).
#
#   benchmarks/gpu.sh [OUT_DIR] [--dry-run]        # OUT_DIR defaults to gpu_out/
#
# Runs, each job in its own process so a failure (an OOM, an unsupported kernel) loses only
# itself and every result is written as soon as it exists:
#   1. step: bench_step.py, the 134M family at context 1024, bf16 compute, batch 32, depths
#      12,1,32 (L12 first: the MFU target), on cuDNN's fused attention (GPU_SH_ATTENTIONS adds
#      dot_product, jax.nn.dot_product_attention's ordinary path); odd d_ff padded to 128;
#   2. sweep45: the miniature depth sweep with 45 seeds per depth as trials (--seeds 0-44),
#      report included; its wall time goes into gpu.json;
#   3. act: bench_act.py, the ACT base preset (d_model 768, M=24), batch 32, T=128;
#   4. fusion: bench_fusion.py, a BERT-base-shaped encoder (12 x 768), batch 32, T=128;
#   5. trials: bench_trials.py, K = 1, 2, 4, 8, 16 trials of the tiny-L2 and small-L4 LMs
#      against K solo steps, and K = 5, 16 trials' evaluation vmapped against trial by trial;
# then gpu_report.py merges the JSONs into OUT_DIR/gpu_results.json, gpu_results.md and gpu.json
# (committed as benchmarks/results/gpu.json) and
# prints the targets: MFU >= 40% for 134M-L12 and L1, >= 22% for L32 (datasheet bf16 peak,
# jaxdepth.trainer.mfu.device_peak_flops) and compile(L32) <= 1.3 x compile(L1).
#
# Time: on an H200 (2026-11-26) XLA's GPU autotuning made each program's first compile take
# 30-70 s; set JAX_COMPILATION_CACHE_DIR to keep compiled programs and autotuning results for a
# later process (a fresh machine given the folder compiles nothing it holds). With a time limit,
# name GPU_SH_PARTS in order of need and set GPU_SH_DEADLINE.
# Without a GPU visible to JAX it stops, unless --dry-run or GPU_SH_ALLOW_CPU=1: then it is a
# smoke run with tiny sizes (any device) that checks the whole pipeline writes both files.
# Environment: GPU_SH_PARTS (default "step sweep45 act fusion trials"; the report always runs, so a session
# with a per-command time limit can run the parts in separate calls into the same OUT_DIR),
# GPU_SH_ATTENTIONS (default "cudnn"), GPU_SH_DEPTHS (default "12 1 32"),
# GPU_SH_BATCH (default 32), PYTHON (default python); GPU_SH_DEADLINE (seconds from the start:
# each job is stopped by SIGTERM at it, and a job with under 20 s left is skipped, so a call
# with a time limit still writes its report); GPU_SH_SWEEP_DEPTHS, GPU_SH_SWEEP_SCRATCH and
# GPU_SH_SWEEP_DIR for the sweep45 part.
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

# The key numbers first (issue 38): the MFU members, then the 45-seed sweep.
PARTS=${GPU_SH_PARTS:-step sweep45 act fusion trials}
if [[ "$SMOKE" == 1 ]]; then  # tiny sizes; cudnn needs a GPU, so only the portable path
    ATTENTIONS=${GPU_SH_ATTENTIONS:-dot_product}
    DEPTHS=${GPU_SH_DEPTHS:-2 1}
    STEP_ARGS=(--family tiny --seq-len 32 --batch "${GPU_SH_BATCH:-4}" --steps 2 --warmup 1)
    ACT_ARGS=(--preset tiny --batch 2 --seq-len 16 --biases 8,-30 --repeats 2 --warmup 1)
    FUSION_ARGS=(--d-model 32 --layers 2 --heads 2 --seq-len 16 --batch 2 --labelled 4 --repeats 2)
    TRIALS_ARGS=(--quick --ks 1,2 --models tiny)
    REPORT_ARGS=(--mfu-depth 2 --compile-depths 1,2)
    SWEEP_ARGS=(--preset miniature --seeds 0-2 --depths 2 --scratch none --tasks passivization
                --pretrain run.steps=4 --pretrain run.save_every=2 --finetune run.steps=4
                --finetune run.eval_every=2 --finetune run.save_every=4
                --finetune optim.warmup_steps=1 --finetune task.n_eval=8)
else
    ATTENTIONS=${GPU_SH_ATTENTIONS:-cudnn}  # dot_product was measured (README): 2.1x slower
    DEPTHS=${GPU_SH_DEPTHS:-12 1 32}
    STEP_ARGS=(--family 134M --seq-len 1024 --batch "${GPU_SH_BATCH:-32}" --steps 10 --warmup 2)
    ACT_ARGS=(--preset base --batch 32 --seq-len 128)
    FUSION_ARGS=(--d-model 768 --layers 12 --heads 12 --seq-len 128 --batch 32 --labelled 32)
    TRIALS_ARGS=(--parts steps,eval --ks 1,2,4,8,16 --models tiny,small --steps 20 --eval-ks 5,16)
    REPORT_ARGS=(--mfu-depth 12 --compile-depths 1,32)
    # GPU_SH_SWEEP_DEPTHS / GPU_SH_SWEEP_SCRATCH narrow the plan (default: all of it).
    SWEEP_ARGS=(--preset miniature --seeds 0-44)
    [[ -n ${GPU_SH_SWEEP_DEPTHS:-} ]] && SWEEP_ARGS+=(--depths "$GPU_SH_SWEEP_DEPTHS")
    [[ -n ${GPU_SH_SWEEP_SCRATCH:-} ]] && SWEEP_ARGS+=(--scratch "$GPU_SH_SWEEP_SCRATCH")
fi

# Each job: name, then the command. Its exit status goes to status.tsv (read by the report),
# its output to logs/NAME.log; a failed job is reported and the others still run.
STATUS="$OUT/status.tsv"
failed=0
job() {
    local name=$1; shift
    local t0=$SECONDS
    local limit=()
    if [[ -n ${GPU_SH_DEADLINE:-} ]]; then  # a call's time limit: stop each job before it
        local left=$((GPU_SH_DEADLINE - SECONDS))
        if (( left < 20 )); then
            echo "== $name: skipped, ${left} s left before GPU_SH_DEADLINE"
            printf '%s\t%s\t%s\n' "$name" skipped 0 >> "$STATUS"
            return
        fi
        limit=(timeout -s TERM -k 10 "$left")
    fi
    echo "== $name: $*"
    "${limit[@]}" "$@" > "$OUT/logs/$name.log" 2>&1
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
        sweep45)
            # The miniature depth sweep with 45 seeds per depth as trials (issue 38, item 5).
            # Its run directories (every trial's checkpoints) go to GPU_SH_SWEEP_DIR, outside
            # OUT; its results, report and wall time are copied into OUT/sweep45/. XLA's
            # autotuning is off for it: 30-46 s per program on the H200 against a 2.2 vs 2.5
            # ms tiny step (benchmarks/README.md), and the sweep compiles a dozen programs.
            SWEEP_DIR=${GPU_SH_SWEEP_DIR:-$OUT/sweep45_runs}
            mkdir -p "$OUT/sweep45"
            t0=$SECONDS
            XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_autotune_level=0" \
                job sweep45 $PY -m jaxdepth.experiments.depth_sweep all --out "$SWEEP_DIR" \
                "${SWEEP_ARGS[@]}"
            cp -r "$SWEEP_DIR"/sweep.json "$SWEEP_DIR"/results.jsonl "$SWEEP_DIR"/report \
                "$OUT/sweep45/" 2>/dev/null
            printf '{"wall_s": %s, "args": "%s"}\n' "$((SECONDS - t0))" "${SWEEP_ARGS[*]}" \
                > "$OUT/sweep45/wall.json" ;;
        *) echo "gpu.sh: unknown part '$part' in GPU_SH_PARTS (step, act, fusion, trials, sweep45)" >&2; exit 2 ;;
    esac
done

mode=gpu
[[ "$SMOKE" == 1 ]] && mode=smoke
$PY benchmarks/gpu_report.py "$OUT" --mode "$mode" "${REPORT_ARGS[@]}" || exit 2
exit $failed
