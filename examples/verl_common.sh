# shellcheck shell=bash
# Sourced by examples/*/train_verl.sh once their settings are read: the checks and the veRL launch
# they share. Each script keeps its own settings block (what a user tunes, with its defaults).
#
#   check_rollout_backend                 ROLLOUT_BACKEND is vllm or sglang, else exit 2
#   knob_overrides                        KNOBS=(...): the shared settings as veRL Hydra overrides
#   launch_verl OVERRIDE...               veRL's trainer with the data, model, backend, agent loop and
#                                         cluster settings, then OVERRIDE... (later ones win). DRY_RUN=1
#                                         composes and checks the configuration instead (no GPU, no Ray).

check_rollout_backend() {
    case "$ROLLOUT_BACKEND" in
        vllm | sglang) ;;
        *) echo "ROLLOUT_BACKEND must be vllm or sglang, not '$ROLLOUT_BACKEND'" >&2; exit 2 ;;
    esac
}

knob_overrides() {
    KNOBS=(
        algorithm.adv_estimator="$ADV_ESTIMATOR"
        algorithm.use_kl_in_reward=False
        data.train_batch_size="$TRAIN_BATCH_SIZE"
        data.max_prompt_length="$MAX_PROMPT_LENGTH"
        data.max_response_length="$MAX_RESPONSE_LENGTH"
        data.filter_overlong_prompts=False
        data.seed="$SEED"
        actor_rollout_ref.model.use_remove_padding=True
        actor_rollout_ref.model.enable_gradient_checkpointing=True
        actor_rollout_ref.actor.optim.lr="$LEARNING_RATE"
        actor_rollout_ref.actor.ppo_mini_batch_size="$PPO_MINI_BATCH_SIZE"
        actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu="$MICRO_BATCH_SIZE_PER_GPU"
        actor_rollout_ref.actor.use_kl_loss=True
        actor_rollout_ref.actor.kl_loss_coef="$KL_LOSS_COEF"
        actor_rollout_ref.actor.kl_loss_type=low_var_kl
        actor_rollout_ref.actor.entropy_coeff="$ENTROPY_COEFF"
        actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu="$MICRO_BATCH_SIZE_PER_GPU"
        actor_rollout_ref.rollout.mode=async
        actor_rollout_ref.rollout.n="$GROUP_SIZE"
        actor_rollout_ref.rollout.temperature="$TEMPERATURE"
        actor_rollout_ref.rollout.gpu_memory_utilization="$GPU_MEMORY_UTILIZATION"
        actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu="$MICRO_BATCH_SIZE_PER_GPU"
        actor_rollout_ref.rollout.calculate_log_probs=True
        actor_rollout_ref.rollout.agent.default_agent_loop=agentboost
        trainer.logger='["console","wandb"]'
        trainer.project_name="$WANDB_PROJECT"
        trainer.save_freq="$SAVE_FREQ"
        trainer.test_freq="$TEST_FREQ"
        trainer.total_epochs="$TOTAL_EPOCHS"
    )
}

launch_verl() {
    # The agent-loop config shipped inside the installed package; every node reads it. Where agentboost
    # is installed at different paths on different nodes, set
    # AGENT_LOOP_CONFIG=agentboost/integrations/verl/agent_loop.yaml (veRL resolves a relative path
    # against each node's site-packages).
    local agent_loop_config=${AGENT_LOOP_CONFIG:-$(python -c 'import agentboost.integrations.verl as v; print(v.agent_loop_config_path())')}
    local trainer=(python -m verl.trainer.main_ppo)
    if [[ "${DRY_RUN:-0}" == 1 ]]; then
        trainer=(python -m agentboost.integrations.verl.config)
    fi
    "${trainer[@]}" \
        data.train_files="$DATA_DIR/train.parquet" \
        data.val_files="$DATA_DIR/test.parquet" \
        actor_rollout_ref.model.path="$MODEL" \
        actor_rollout_ref.rollout.name="$ROLLOUT_BACKEND" \
        actor_rollout_ref.rollout.tensor_model_parallel_size="$ROLLOUT_TP" \
        actor_rollout_ref.rollout.agent.agent_loop_config_path="$agent_loop_config" \
        actor_rollout_ref.rollout.agent.num_workers="$AGENT_WORKERS" \
        trainer.experiment_name="$EXPERIMENT_NAME" \
        trainer.n_gpus_per_node="$N_GPUS_PER_NODE" \
        trainer.nnodes="$NNODES" \
        "$@"
}
