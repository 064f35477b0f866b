"""On the host runtime, torch.optim's default implementation is CPU's.

With `foreach=None` (the default) an optimizer takes its foreach
implementation for the device types PyTorch lists as having foreach
kernels, which name every PrivateUse1 backend, and its single-tensor one for
CPU tensors. The two round differently for some optimizers (NAdam, RAdam,
ASGD), so on the host runtime, whose kernels are CPU's, flagos parameters
stepped otherwise than the same parameters on the CPU. Here the lookup that
torch.optim (and swa_utils) make leaves flagos out while the host runtime is
active, so the default is the CPU's and so are the results; `foreach=True`
still takes the foreach implementation. Other callers of the list (gradient
clipping, which takes foreach on the CPU as well) are left as they are.
"""

import importlib

# By name: torch.optim does not keep its `optimizer` submodule as an attribute.
_MODULES = ("torch.optim.optimizer", "torch.optim.swa_utils")
_NAME = "_get_foreach_kernels_supported_devices"


def _without_flagos(pytorchs):
    def supported():
        return [device for device in pytorchs() if device != "flagos"]

    supported.flagos_replaces = pytorchs
    return supported


def install():
    """Once, when the host runtime is activated; a torch without the lookup
    keeps its own default."""
    for name in _MODULES:
        module = importlib.import_module(name)
        pytorchs = getattr(module, _NAME, None)
        if callable(pytorchs) and not hasattr(pytorchs, "flagos_replaces"):
            setattr(module, _NAME, _without_flagos(pytorchs))
