"""A tiny Qwen3 trains and decodes on flagos exactly as on the native device
(CPU on the host runtime): losses, parameters and greedy tokens bitwise equal,
nothing through cpu_fallback."""

import pytest
import torch

import flagos_core
from flagos_core import demo

pytestmark = pytest.mark.skipif(flagos_core.runtime()["name"] != "host",
                                reason="compares with CPU; the GPU tests cover the cuda runtime")


def test_training_and_decoding_match_cpu():
    batches = demo.make_batches(4)
    native = demo.build_model("cpu")
    native_losses = demo.train_steps(native, demo.make_optimizer(native), batches)

    flagos = demo.build_model("flagos")
    assert demo.weights_tied(flagos)
    with flagos_core.trace() as t:
        flagos_losses = demo.train_steps(flagos, demo.make_optimizer(flagos), batches)
        prompt = batches[0][:1, :8]
        flagos_tokens = demo.greedy_tokens(flagos, prompt, new_tokens=12)
    native_tokens = demo.greedy_tokens(native, prompt, new_tokens=12)

    assert flagos_losses == native_losses
    assert demo.params_equal(native, flagos) == []
    assert torch.equal(flagos_tokens, native_tokens)
    assert t.fallbacks == []
    assert t.by_provider().get("host", 0) > 1000
