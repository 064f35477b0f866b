"""example_py: a kernel provider written in Python, serving neg and relu.

Each kernel gets the overload's arguments as Python objects (flagos tensors,
numbers, ...) and returns its results. flagos_core.as_native gives the
runtime's native tensor over a flagos tensor's memory (CPU on the host
runtime, CUDA on flagos-cuda) and flagos_core.from_native the flagos tensor
over a native tensor's memory; neither copies data.
"""

import torch

import flagos_core

NAME = "example_py"


def neg(self):
    # neg(Tensor self) -> Tensor
    out = torch.neg(flagos_core.as_native(self))
    return flagos_core.from_native(out, self.device.index)


def relu(self):
    # relu(Tensor self) -> Tensor
    out = torch.relu(flagos_core.as_native(self))
    return flagos_core.from_native(out, self.device.index)


# Keys are overload names as `python -m flagos_core routes` lists them.
KERNELS = {"neg": neg, "relu": relu}


def register():
    flagos_core.register_python_provider(NAME, KERNELS)
