"""Clients of remote servers (SGLang, vLLM, ``agentboost serve``): transport, routing, probe, wire formats."""
