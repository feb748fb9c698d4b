"""The local trainer: GRPO / RLOO / REINFORCE++ advantages and a PPO-clipped policy loss on one machine.

``agentboost train CONFIG.yaml`` runs :class:`~agentboost.train.trainer.Trainer` with a
:class:`~agentboost.train.config.TrainConfig`; the math lives in :mod:`agentboost.train.algorithms`.
Nothing here is imported by ``import agentboost``.
"""
