#!/usr/bin/env bash
# The training runs behind docs/RESULTS.md `## Training`, in two lanes of one thread each so that the two CPU
# cores of this machine stay busy (the time-budgeted recipes run alone in lane A, the step-counted experiments in
# lane B). Every run writes runs/NAME/{recipe.json,metrics.jsonl,result.json,best,final}; the tables are then
# printed by benchmarks/training_table.py and benchmarks/train_compare.py (see docs/RESULTS.md).
#
#   bash benchmarks/training_results.sh            # both lanes, s128, compare (≈ 2 h on 2 cores)
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
    # the shipped sct-tiny recipe (SCT distillation from minilm-l6, 20 minutes), then the same student and time
    # budget with the two baselines: plain MSE distillation and crop InfoNCE without a teacher
    train sct-tiny sct-tiny --set num_threads=1
    train student-mse sct-tiny --set num_threads=1 --set objective=mse_distillation --set "objective_params={}"
    train student-infonce sct-tiny --set num_threads=1 --set objective=infonce \
        --set "objective_params={temperature=0.05}" --set views=crop --set validation_metric=crop_retrieval
    train sct-tiny-pca distil-tiny-pca --set num_threads=1  # the 128-wide PCA-initialised student (then sct-tiny-pca)
}

s128() {  # sct-tiny with 128-token training crops, both threads, 25 minutes (run alone)
    train sct-tiny-s128 sct-tiny --set num_threads=2 --set max_seq_length=128 --set time_budget_s=1500
}

lane_b() {
    # TMFT with its defaults (probe → truncate at the best of layers 1–3 → SCT from the full model, 20 min)
    train tmft tmft --set num_threads=1
    # TMFT at half the layers (3 of 6) instead of the probe's pick, lr 1e-4 as for sct-tiny
    train tmft-l3 tmft --set num_threads=1 --set truncate=3 --set lr=1e-4
    train exp-crop crop-minilm "${IN_DOMAIN[@]}"
    train exp-dropout crop-minilm "${IN_DOMAIN[@]}" --set objective=simcse --set views=dropout
    train exp-crop-last2 crop-minilm "${IN_DOMAIN[@]}" --set train_last_layers=2
    # papers/001 §3.1, self-supervised: the reference is the trained model without gradient; with and without its projector
    train exp-sct crop-minilm "${IN_DOMAIN[@]}" --set objective=sct --set "objective_params={}"
    train exp-sct-noproj crop-minilm "${IN_DOMAIN[@]}" --set objective=sct --set "objective_params={projector_layers=0}"
    for objective in barlow_twins vicreg; do  # papers/004: the non-contrastive objectives on the same crops
        train "exp-$objective" crop-minilm "${IN_DOMAIN[@]}" --set objective=$objective --set "objective_params={}"
    done
    for gamma in 0 0.1; do  # papers/002 Table 2: SimCSE with and without RR (γ = 0.1 of its grid), 3 seeds
        for seed in 0 1 2; do
            train "rr-g$gamma-s$seed" crop-minilm "${IN_DOMAIN[@]}" --set objective=simcse --set views=dropout \
                --set max_steps=40 --set eval_every=20 --set seed=$seed --set rank_reduction=$gamma
        done
    done
}

compare() {
    # the compact models against their teacher on the whole offline suite plus the held-out crops of the
    # students' corpus, with texts/s (batch 32; rounds alternate the models); then the in-domain experiments
    # on ACLSum's held-out crops and the two general tasks closest to them
    .venv/bin/python benchmarks/train_compare.py minilm-l6 minilm-l3 runs/sct-tiny/best runs/sct-tiny-s128/best \
        runs/student-mse/best runs/student-infonce/best runs/sct-tiny-pca/best runs/tmft/best runs/tmft-l3/best \
        --baseline minilm-l6 --speed \
        --heldout-from runs/sct-tiny/recipe.json --out runs/compare-compact.json | tee logs/compare-compact.md
    .venv/bin/python benchmarks/train_compare.py minilm-l6 runs/exp-crop/final runs/exp-dropout/final \
        runs/exp-crop-last2/final runs/exp-barlow_twins/final runs/exp-vicreg/final runs/exp-sct/final \
        runs/exp-sct-noproj/final --baseline minilm-l6 \
        --tasks LeeDocSTS ACLSumRetrieval --heldout-from runs/exp-crop/recipe.json \
        --out runs/compare-in-domain.json | tee logs/compare-in-domain.md
}

case "${1:-all}" in
    all) { lane_a & lane_b & wait; } && s128 && compare ;;
    lane_a | lane_b | sct | s128 | compare) "$1" ;;
    *) echo "usage: $0 [all|lane_a|lane_b|sct|s128|compare]" >&2; exit 2 ;;
esac
