"""A clear error for a backward over native accelerator tensors (cuda, ...)
in a process where flagos is registered.

Once any PrivateUse1 device is registered, PyTorch's autograd engine takes
its streams from `at::getAccelerator()`, which is then flagos, and a backward
over CUDA tensors stops inside PyTorch on an internal assert
(pytorch/pytorch#161129). flagos cannot change the engine; it turns that
assert into an error that says what happened and what to do. Backward passes
over flagos tensors are not affected.
"""

import torch

# The assert's condition, as the engine's message prints it.
ENGINE_ASSERT = "opt_ready_stream && opt_parent_stream"

MESSAGE = (
    "flagos: a backward pass over {devices} tensors cannot run in a process where flagos is loaded: "
    "PyTorch's autograd engine then takes its streams from the flagos device (PrivateUse1) and fails on the "
    "native tensors (pytorch/pytorch#161129; flagos tensors are not affected). Either train on flagos "
    "(model.to('flagos')), or run native-device training in a process without flagos: set "
    "TORCH_DEVICE_BACKEND_AUTOLOAD=0 before importing torch and do not import flagos_core there."
)


def _root_devices(roots):
    devices = set()
    for root in roots if isinstance(roots, (list, tuple)) else (roots,):
        if isinstance(root, torch.Tensor):
            devices.add(root.device.type)
    return devices


class EngineWithClearError:
    """torch's autograd engine object, with run_backward's internal assert on
    native tensors turned into a clear error; everything else passes through."""

    def __init__(self, engine):
        self._engine = engine

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def run_backward(self, roots, *args, **kwargs):
        try:
            return self._engine.run_backward(roots, *args, **kwargs)
        except RuntimeError as error:
            native = _root_devices(roots) - {"flagos", "cpu"}
            if ENGINE_ASSERT not in str(error) or not native:
                raise
            raise RuntimeError(MESSAGE.format(devices=", ".join(sorted(native)))) from error


def install():
    """Wraps the engine that torch.autograd.backward and grad call (once)."""
    from torch.autograd.variable import Variable

    if not isinstance(Variable._execution_engine, EngineWithClearError):
        Variable._execution_engine = EngineWithClearError(Variable._execution_engine)
