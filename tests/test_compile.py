"""torch.compile on flagos: the graph-capturing backends run on flagos's
kernels; inductor, which has no flagos code generation yet, says so and
what to use instead, rather than stopping on a KeyError."""

import pytest
import torch

import flagos_core


def make(device):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).to(device)


@pytest.mark.skipif(flagos_core.runtime()["name"] != "host", reason="compares with CPU")
def test_aot_eager_trains_as_eager_cpu_does():
    x = torch.randn(8, 16)
    native = make("cpu")
    want = native(x).pow(2).mean()
    want.backward()
    model = make("flagos")
    with flagos_core.trace() as t:
        loss = torch.compile(model, backend="aot_eager")(x.to("flagos")).pow(2).mean()
        loss.backward()
    assert torch.equal(loss.cpu(), want)
    assert all(torch.equal(f.grad.cpu(), n.grad) for f, n in zip(model.parameters(), native.parameters()))
    assert t.fallbacks == [] and t.by_provider()


def test_inductor_names_what_is_missing_and_what_works():
    torch._dynamo.reset()
    with pytest.raises(Exception, match="inductor, has no code generation for the flagos device yet.*aot_eager"):
        torch.compile(lambda x: x * 2 + 1)(torch.ones(3, device="flagos"))
    # Asking torch.flagos for anything else is still an ordinary AttributeError.
    assert not hasattr(torch.flagos, "no_such_name")


@pytest.mark.gpu
def test_inductor_message_on_the_cuda_runtime():
    # The same on the CUDA plugin (gpu-check runs the gpu-marked tests there).
    test_inductor_names_what_is_missing_and_what_works()
