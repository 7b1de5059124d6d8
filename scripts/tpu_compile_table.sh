#!/usr/bin/env bash
# The pods guide's table: every config's steps compiled by the TPU compiler
# (python -m transformer_xl.compile) on its slice preset and on a v5e and a
# v5p slice; one JSON per run in results/tpu_compile/, then the table:
#   python scripts/tpu_compile_table.py results/tpu_compile > results/tpu_compile/REPORT.md
# Runs for hours on 2 cores (JOBS compiles at once, default 2); a JSON already there is not
# compiled again.  The H100 rows need [gpu-compile] (GPU_PYTHON: a python that has it).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
OUT=${OUT:-results/tpu_compile}
mkdir -p "$OUT"
JOBS=${JOBS:-2}
run() {  # name config topology [flags...]: compiled in the background, JOBS at a time
  local name=$1
  [[ -s $OUT/$name.json ]] && return 0
  while (($(jobs -rp | wc -l) >= JOBS)); do wait -n; done
  compile "$@" &
}
compile() {
  local name=$1 config=$2 topology=$3
  shift 3
  local json="$OUT/$name.json"
  local py=python
  [[ $topology == h100* ]] && py=${GPU_PYTHON:-python}  # an environment with [gpu-compile]
  echo "== $name: $config on $topology $*"
  "$py" -m transformer_xl.compile --config="$config" --topology="$topology" \
    --json="$json" "$@" >"$OUT/$name.log" 2>&1
  echo "   $name: exit $? ($(grep -c 'compiled in' "$OUT/$name.log") steps)"
}
xla=(--config.model.attention_impl=xla)
# The kernel has no dropatt: a training step with dropatt > 0 would take the XLA path.
pallas=(--config.model.attention_impl=pallas --config.model.dropatt=0)
# Every config on its slice preset, one v5e and one v5p slice (the paper's largest also on a
# v6e), both attentions; H100s for the paper's configs.
for impl in xla pallas; do
  if [[ $impl == xla ]]; then flags=("${xla[@]}"); else flags=("${pallas[@]}"); fi
  for slice in v3-32 v5e-256 v5p-128; do
    run "enwik8_24l_${slice}_$impl" configs/enwik8_24l.py:v3-32 $slice "${flags[@]}"
    run "text8_24l_${slice}_$impl" configs/text8_24l.py:v3-32 $slice "${flags[@]}"
  done
  run "enwik8_24l_v6e-64_$impl" configs/enwik8_24l.py:v3-32 v6e-64 "${flags[@]}"
  for slice in v3-64 v5e-256 v5p-128; do
    run "wt103_large_${slice}_$impl" configs/wt103_large.py:v3-64 $slice "${flags[@]}"
  done
  for slice in v4-8 v5e-4 v5p-8; do  # batch 60: 4 chips (v5e-8's 8 do not divide it)
    run "wt103_base_${slice}_$impl" configs/wt103_base.py $slice "${flags[@]}"
  done
  for slice in v4-8 v5e-8 v5p-8; do
    run "enwik8_12l_${slice}_$impl" configs/enwik8_12l.py $slice "${flags[@]}" \
      --config.train.global_batch=24
  done
  run "enwik8_12l_h100_$impl" configs/enwik8_12l.py h100 "${flags[@]}"
  run "wt103_base_h100_$impl" configs/wt103_base.py h100 "${flags[@]}"
  run "enwik8_24l_h100x8_$impl" configs/enwik8_24l.py:v3-32 h100x8 "${flags[@]}"
  run "wt103_large_h100x8_$impl" configs/wt103_large.py:v3-64 h100x8 "${flags[@]}"
done
# The kernel on v3 in float32 (Mosaic has no bfloat16 matrix products before v4).
run "enwik8_24l_v3-32_pallas-float32" configs/enwik8_24l.py:v3-32 v3-32 "${pallas[@]}" \
  --config.model.dtype=float32
# Without remat on 16 v5e chips; then twice the batch, too large: the search finds the fix.
run "enwik8_24l_v5e-16_remat-none_xla" configs/enwik8_24l.py:v3-32 v5e-16 "${xla[@]}" \
  --config.model.remat=none
run "enwik8_24l_v5e-16_remat-none_batch128_xla" configs/enwik8_24l.py:v3-32 v5e-16 "${xla[@]}" \
  --config.model.remat=none --config.train.global_batch=128 --steps=train --max_tries=4
# The successors' configs, the largest paper config, and those without a preset.
for impl in xla pallas; do
  if [[ $impl == xla ]]; then flags=("${xla[@]}"); else flags=("${pallas[@]}"); fi
  for slice in v3-32 v5e-32 v5p-32; do
    run "compressive_enwik8_${slice}_$impl" configs/compressive_enwik8.py:v3-32 $slice "${flags[@]}"
  done
  for slice in v4-8 v5e-8 v5p-8; do
    run "rmt_enwik8_${slice}_$impl" configs/rmt_enwik8.py:rmt $slice "${flags[@]}"
    run "knn_pg19_${slice}_$impl" configs/knn_pg19.py:knn_65k $slice "${flags[@]}"
    run "babilong_armt_${slice}_$impl" configs/babilong.py:armt $slice "${flags[@]}" \
      --vocab=50257 --max_tries=2  # GPT-2's tokenizer; a 5-minute compile a try
  done
  for slice in v3-512 v5e-256 v5p-256; do
    run "lm1b_large_${slice}_$impl" configs/lm1b_large.py:v3-512 $slice "${flags[@]}"
  done
  # The paper's configs without a slice preset (the reference trained them on GPUs).
  for slice in v5e-32 v5p-32; do
    run "lm1b_base_${slice}_$impl" configs/lm1b_base.py $slice "${flags[@]}"
  done
  for slice in v5e-4 v5p-8; do  # batch 20: 4 chips
    run "ptb_${slice}_$impl" configs/ptb.py $slice "${flags[@]}"
  done
done
wait
