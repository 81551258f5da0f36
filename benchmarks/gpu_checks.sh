#!/bin/bash
# The GPU checks the open issues name, as one short script for a lent one-GPU machine (H100 or
# H200, torch 2.11+cu130 there, no network): FP8 against BF16 in autopar's runtime (issue 28),
# `autopar validate` on two models no GPU run had validated before and `autopar profile` (issue 31,
# deliverable 6), autopar's runner against plain torch on CUDA, eager and compiled (issue 29's
# bench). Each step has its own time limit so that one slow step cannot cost the others; every
# output lands in OUTDIR, and each step prints as it goes (a step killed at its limit keeps its lines).
# First run (one H200, 2026-11-28): only the profile finished; the FP8 bench and both validates
# reached their limits before printing a result: the bench's one-process apply started gloo and
# trained on the CPU (fixed: apply starts NCCL where CUDA is), and each built its model on the
# CPU first (the bench's 1.1 B model took 60 s to initialise on the 2-core dev machine, and
# validate builds one per plan); both now start built-in models on meta and materialise them on
# the GPU, and the bench prints every step.
#
#   bash benchmarks/gpu_checks.sh OUTDIR
#
# Needs torch with CUDA, and ortools + torchao==0.18.0 importable (carried as wheels on the lent
# machine: PYTHONPATH=/tmp/site).
set -u
OUTDIR=${1:?usage: bash benchmarks/gpu_checks.sh OUTDIR}
mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:${PYTHONPATH:-}"
ap() { python3 -c 'import sys; from autopar.cli.main import main; sys.exit(main())' "$@"; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUTDIR/gpu.txt"
python3 -c "import torch, torchao, ortools; print('torch', torch.__version__, 'torchao', torchao.__version__, 'ortools', ortools.__version__)" 2>&1 | tee -a "$OUTDIR/gpu.txt"
case "$(nvidia-smi --query-gpu=name --format=csv,noheader)" in
  *H200*) HW=h200-141g-sxm ;;
  *) HW=h100-80g-sxm ;;
esac
echo "hardware profile: $HW" | tee -a "$OUTDIR/gpu.txt"
t0=$(date +%s)
cleanup() { pkill -9 -f 'multiprocessing.spawn' 2>/dev/null; true; }   # ranks a timeout left
stamp() { echo "== $1 done at +$(( $(date +%s) - t0 )) s (rc $2)" | tee -a "$OUTDIR/gpu.txt"; }

# 1. FP8 vs BF16, 20 steps each, rows compiled on both sides (torchtitan runs Float8 compiled)
timeout 120 python3 benchmarks/bench_runtime_fp8.py > "$OUTDIR/fp8_eager.txt" 2>&1
stamp fp8-eager $?
tail -8 "$OUTDIR/fp8_eager.txt"

# 2. validate: a Llama 3 8B-wide slice at 8192 tokens and a Mixtral-wide MoE slice (8 plans each)
LLAMA='llama:layers=4,hidden=4096,heads=32,kv_heads=8,ffn=14336,vocab=128256,seq=8192'
MOE='moe:layers=2,hidden=4096,heads=32,kv_heads=8,ffn=14336,vocab=32000,seq=4096,experts=8,top_k=2'
timeout 150 python3 -m autopar.cli.main validate "$LLAMA" --hardware $HW --nproc 1 --global-batch 8 --count 8 --steps 3 \
  --warmup 1 -o "$OUTDIR/validate_llama4l.json" > "$OUTDIR/validate_llama4l.txt" 2>&1
stamp validate-llama $?; cleanup
tail -20 "$OUTDIR/validate_llama4l.txt"
timeout 120 python3 -m autopar.cli.main validate "$MOE" --hardware $HW --nproc 1 --global-batch 16 --count 8 --steps 3 \
  --warmup 1 -o "$OUTDIR/validate_moe2l.json" > "$OUTDIR/validate_moe2l.txt" 2>&1
stamp validate-moe $?; cleanup
tail -20 "$OUTDIR/validate_moe2l.txt"

# 3. the runtime's kernel constants on this GPU
timeout 70 python3 -m autopar.cli.main profile --nproc 1 --quick --no-progress -o "$OUTDIR/measured.toml" > "$OUTDIR/profile.txt" 2>&1
stamp profile $?
tail -12 "$OUTDIR/profile.txt"
