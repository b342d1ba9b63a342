#!/usr/bin/env bash
# The training runs behind docs/RESULTS.md `## Training`, in two lanes of one thread each so that the two CPU
# cores of this machine stay busy (the time-budgeted recipes run alone in lane A, the step-counted experiments in
# lane B). Every run writes runs/NAME/{recipe.json,metrics.jsonl,result.json,best,final}; the tables are then
# printed by benchmarks/training_table.py and benchmarks/train_compare.py (see docs/RESULTS.md).
#
#   bash benchmarks/training_results.sh            # both lanes (≈ 45 min on 2 cores)
#   bash benchmarks/training_results.sh lane_a     # or one lane
#   bash benchmarks/training_results.sh sct        # the shipped sct-tiny recipe alone, with both threads
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
EMBEDDER=${EMBEDDER:-.venv/bin/embedder}
mkdir -p logs

train() {  # train NAME RECIPE [--set k=v ...]: one run, its log in logs/NAME.log
    local name=$1 recipe=$2
    shift 2
    echo "$(date +%T) start $name" >&2
    "$EMBEDDER" train "training/recipes/$recipe.toml" --set "name=$name" --set progress_bar=false "$@" \
        >"logs/$name.log" 2>&1
    echo "$(date +%T) done  $name" >&2
}

# In-domain experiments (papers/000 §4): minilm-l6 on ACLSum body paragraphs, batch 32, 100 steps, held-out
# crop-pair retrieval every 25 steps. One thread each.
IN_DOMAIN=(--set num_threads=1 --set batch_size=32 --set max_seq_length=64 --set max_steps=100
    --set time_budget_s=none --set eval_every=25 --set checkpoint_every=0)

sct() { train sct-tiny sct-tiny; }

lane_a() {
    # TMFT with its defaults (probe → truncate at the best of layers 1–3 → SCT from the full model, 20 min)
    train tmft tmft --set num_threads=1
    # the sct-tiny student trained with plain crop InfoNCE instead of SCT distillation (10 minutes)
    train student-infonce sct-tiny --set num_threads=1 --set objective=infonce --set time_budget_s=600 \
        --set lr=1e-4 --set "objective_params={temperature=0.05}"
    for seed in 0 1 2; do  # papers/002 Table 2: SimCSE with and without RR (γ = 0.1 of its grid), 3 seeds
        train "rr-g0-s$seed" crop-minilm "${IN_DOMAIN[@]}" --set objective=simcse --set views=dropout \
            --set max_steps=40 --set eval_every=20 --set seed=$seed
    done
}

lane_b() {
    train exp-crop crop-minilm "${IN_DOMAIN[@]}"
    train exp-dropout crop-minilm "${IN_DOMAIN[@]}" --set objective=simcse --set views=dropout
    train exp-crop-last2 crop-minilm "${IN_DOMAIN[@]}" --set train_last_layers=2
    for objective in barlow_twins vicreg; do  # papers/004: the non-contrastive objectives on the same crops
        train "exp-$objective" crop-minilm "${IN_DOMAIN[@]}" --set objective=$objective --set "objective_params={}"
    done
    for seed in 0 1 2; do
        train "rr-g0.1-s$seed" crop-minilm "${IN_DOMAIN[@]}" --set objective=simcse --set views=dropout \
            --set max_steps=40 --set eval_every=20 --set seed=$seed --set rank_reduction=0.1
    done
}

case "${1:-all}" in
    all) lane_a & lane_b & wait ;;
    lane_a | lane_b | sct) "$1" ;;
    *) echo "usage: $0 [all|lane_a|lane_b|sct]" >&2; exit 2 ;;
esac
