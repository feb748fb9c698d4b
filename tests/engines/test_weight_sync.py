"""Weight pushes to vLLM: the checkpoint written (HF names, LoRA merged) and the endpoint sequence, against a
server that answers vLLM's development endpoints on loopback. The real server is in test_vllm_real.py."""

from __future__ import annotations

import asyncio
import copy
import threading

import pytest
import torch
from aiohttp import web
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM

from agentboost.engines.remote.weight_sync import (
    StaleRolloutError,
    WeightSync,
    WeightSyncError,
    hf_state_dict,
)


def tiny_llama(tied: bool) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tied,
    )
    return LlamaForCausalLM(config).eval()


def test_a_lora_policy_is_pushed_as_the_merged_weights_under_hf_names_and_left_untouched():
    base = tiny_llama(tied=True)
    policy = get_peft_model(
        copy.deepcopy(base),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0),
    )
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.add_(0.1 * torch.randn_like(parameter))
    before = {name: tensor.clone() for name, tensor in policy.state_dict().items()}
    state = hf_state_dict(policy)
    merged = copy.deepcopy(policy).merge_and_unload().state_dict()
    assert set(state) == set(merged) - {"lm_head.weight"}  # tied: vLLM ties the head itself
    assert all(torch.equal(state[name], merged[name]) for name in state)
    assert not torch.equal(
        state["model.layers.0.self_attn.q_proj.weight"],
        base.state_dict()["model.layers.0.self_attn.q_proj.weight"],
    )
    assert all(torch.equal(before[name], tensor) for name, tensor in policy.state_dict().items())


def test_full_weights_keep_an_untied_head():
    model = tiny_llama(tied=False)
    state = hf_state_dict(model)
    assert set(state) == set(model.state_dict()) and "lm_head.weight" in state


class DevServer:
    """vLLM's development endpoints, recording the order of the calls (and failing one on request)."""

    def __init__(self, fail: str | None = None) -> None:
        self.calls: list[tuple[str, object]] = []
        self.fail = fail
        self.url = ""
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else None
        path = request.path_qs
        self.calls.append((path, body))
        if self.fail == request.path:
            return web.json_response({"detail": "Not Found"}, status=404)
        return web.json_response({"status": "ok"})

    def __enter__(self) -> DevServer:
        def serve() -> None:
            async def main() -> None:
                app = web.Application()
                for path in ("/pause", "/resume", "/collective_rpc", "/reset_prefix_cache"):
                    app.router.add_post(path, self._handle)
                runner = web.AppRunner(app, access_log=None)
                await runner.setup()
                await web.TCPSite(runner, "127.0.0.1", 0).start()
                host, port = runner.addresses[0][:2]
                self.url = f"http://{host}:{port}"
                self._stop = asyncio.Event()
                self._ready.set()
                await self._stop.wait()
                await runner.cleanup()

            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(main())

        self._thread = threading.Thread(target=serve, daemon=True)
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *_: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


def test_a_push_writes_the_checkpoint_then_pauses_reloads_resets_the_prefix_cache_and_resumes(tmp_path):
    model = tiny_llama(tied=False)
    with DevServer() as server:
        sync = WeightSync(server.url, tmp_path / "weights")
        assert sync.push(model) == 1
    assert [path for path, _ in server.calls] == [
        "/pause?mode=wait",
        "/collective_rpc",
        "/reset_prefix_cache",
        "/resume",
    ]
    assert server.calls[1][1] == {
        "method": "agentboost_reload_weights",
        "kwargs": {"weights_path": str(tmp_path / "weights")},
    }
    written = load_file(str(tmp_path / "weights" / "model.safetensors"))
    assert set(written) == set(model.state_dict())
    assert sync.last["write_s"] >= 0 and sync.last["reload_s"] >= 0
    sync.check_fresh(1)
    with pytest.raises(StaleRolloutError, match="weight version 0"):
        sync.check_fresh(0)


def test_a_server_without_development_mode_is_refused_with_the_fix_and_still_resumed(tmp_path):
    with DevServer(fail="/collective_rpc") as server:
        sync = WeightSync(server.url, tmp_path / "weights")
        with pytest.raises(WeightSyncError, match="VLLM_SERVER_DEV_MODE=1") as caught:
            sync.push(tiny_llama(tied=False))
    assert "\n" not in str(caught.value)
    assert [path for path, _ in server.calls][-1] == "/resume"  # never left paused
    assert sync.version == 0
