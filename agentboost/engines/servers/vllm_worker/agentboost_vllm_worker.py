"""A vLLM worker extension for weight pushes: ``--worker-extension-cls agentboost_vllm_worker.WeightReload``.

This file is imported by the vLLM server's own interpreter (its directory is put on the server's
``PYTHONPATH`` by :class:`agentboost.engines.servers.vllm_server.VLLMServer`), so it imports nothing from
agentboost and nothing vLLM does not already have.

Why it exists: vLLM-CPU keeps a packed copy of each matrix it multiplies by (oneDNN or sgl-kernel,
made by ``process_weights_after_loading``). ``reload_weights`` rebuilds that copy for every layer it
loads weights into; a tied output head (``tie_word_embeddings``: ``lm_head`` shares ``embed_tokens``'
weight) loads nothing of its own, so it kept multiplying by the packed copy of the *old* embeddings
(measured: logits 1e-2 off after a push that changed the embeddings). After the reload, this method
rebuilds the packed copy of every layer whose weight is another layer's weight.
"""

from __future__ import annotations

from typing import Any


class WeightReload:
    """Mixed into vLLM's worker class; called through ``POST /collective_rpc``."""

    def agentboost_reload_weights(self, weights_path: str) -> list[str]:
        """``reload_weights`` from ``weights_path``, then refresh layers that share a reloaded weight.

        Returns the names of the layers refreshed.
        """
        worker: Any = self
        worker.reload_weights(weights_path=weights_path)
        model = worker.model_runner.get_model()
        owner: dict[int, str] = {}
        refreshed = []
        for name, module in model.named_modules():
            weight = module._parameters.get("weight")
            if weight is None:
                continue
            if id(weight) not in owner:
                owner[id(weight)] = name
                continue
            method = getattr(module, "quant_method", None)
            if method is not None and hasattr(method, "process_weights_after_loading"):
                method.process_weights_after_loading(module)
                refreshed.append(name)
        return refreshed
