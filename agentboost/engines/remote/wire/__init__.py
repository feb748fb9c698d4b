"""The SGLang and vLLM wire formats, defined once: what goes over HTTP and how agentboost reads it.

* :mod:`~agentboost.engines.remote.wire.sglang`: SGLang's native ``POST /generate`` and its model-info
  answers;
* :mod:`~agentboost.engines.remote.wire.vllm`: vLLM's ``POST /v1/completions`` with token-id prompts and
  ``GET /v1/models``;
* :mod:`~agentboost.engines.remote.wire.common`: the checks both share.

Each format module holds the request and response shapes (``TypedDict``), the client's two functions
(``build_request``, ``parse_response``), the server's two (``read_request``, ``build_response``) and the
sampling fields veRL's server manager forwards to that backend (``sampling_params``). The SGLang and vLLM
clients (:mod:`agentboost.engines.remote.sglang`, :mod:`agentboost.engines.remote.vllm`), ``agentboost serve``
(:mod:`agentboost.engines.servers.serve`) and the veRL adapter (:mod:`agentboost.integrations.verl.engine`)
all use them, so a field is named in one place. ``tests/fixtures/*.json`` hold the documented bodies the
functions are tested against.
"""
