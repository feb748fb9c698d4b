"""Servers and launchers: ``agentboost serve``, the vLLM launcher and worker extension, fault injection."""
