"""tau2-bench (airline, retail) on the real ``tau2`` package: tools, simulated customer, tau2's reward.

Import :class:`~agentboost.envs.tau2.environment.Tau2Environment` from its module (or use the
registered name ``tau2``); this package's ``__init__`` stays empty so ``import agentboost`` never
loads tau2.
"""
