"""A backward over native accelerator tensors, which PyTorch's engine cannot
run once flagos is registered (pytorch/pytorch#161129), ends in an error that
says so and what to do; every other backward is untouched. The real failure
needs a GPU (test_cuda_plugin.py); here the wrapper's logic is checked with a
stand-in engine, meta tensors playing the native accelerator's."""

import pytest
import torch

import flagos_core  # noqa: F401
from flagos_core import _native_backward
from torch.autograd.variable import Variable

ASSERT = "opt_ready_stream && opt_parent_stream INTERNAL ASSERT FAILED at engine.cpp"


class RaisingEngine:
    def __init__(self, message):
        self.message = message
        self.calls = 0

    def run_backward(self, roots, *args, **kwargs):
        self.calls += 1
        raise RuntimeError(self.message)

    def queue_callback(self, callback):
        return ("queued", callback)


def test_torch_backward_goes_through_the_wrapped_engine():
    assert isinstance(Variable._execution_engine, _native_backward.EngineWithClearError)
    for device in ("cpu", "flagos"):
        x = torch.arange(3.0, device=device, requires_grad=True)
        (x * x).sum().backward()
        assert torch.equal(x.grad.cpu(), torch.tensor([0.0, 2.0, 4.0]))
        (g,) = torch.autograd.grad((x * 3).sum(), x)
        assert torch.equal(g.cpu(), torch.full((3,), 3.0))


def test_the_engine_assert_on_native_tensors_becomes_a_clear_error():
    engine = _native_backward.EngineWithClearError(RaisingEngine(ASSERT))
    root = torch.ones((), device="meta")
    with pytest.raises(RuntimeError, match="backward pass over meta tensors") as info:
        engine.run_backward((root,), (None,), False, False, (), True, True)
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in str(info.value) and "161129" in str(info.value)
    assert ASSERT in str(info.value.__cause__)


def test_other_errors_and_flagos_roots_keep_their_own_message():
    flagos_root = torch.ones((), device="flagos")
    engine = _native_backward.EngineWithClearError(RaisingEngine(ASSERT))
    with pytest.raises(RuntimeError, match="INTERNAL ASSERT FAILED"):
        engine.run_backward((flagos_root,))
    engine = _native_backward.EngineWithClearError(RaisingEngine("element 0 of tensors does not require grad"))
    with pytest.raises(RuntimeError, match="^element 0 of tensors does not require grad$"):
        engine.run_backward((torch.ones((), device="meta"),))


def test_other_engine_methods_pass_through():
    inner = RaisingEngine(ASSERT)
    engine = _native_backward.EngineWithClearError(inner)
    assert engine.queue_callback(print) == ("queued", print)
    _native_backward.install()  # a second install does not wrap twice
    assert not isinstance(Variable._execution_engine._engine, _native_backward.EngineWithClearError)


def test_queue_callback_inside_a_backward_reaches_the_engine():
    # DDP, FSDP and torch's module tracker queue callbacks through the engine object.
    ran = []
    x = torch.ones(2, device="flagos", requires_grad=True)
    y = x * 2
    y.register_hook(lambda grad: Variable._execution_engine.queue_callback(lambda: ran.append(True)))
    y.sum().backward()
    assert ran == [True]
