"""torch.compile's default backend, inductor, on flagos: a clear error.

Inductor has no code generation for flagos yet. Without a word from flagos
it stops on `KeyError: 'flagos'` deep in its code generation; with this it
says what is missing and which backends work (the ones that run flagos's
eager kernels). Inductor asks a PrivateUse1 device's module (torch.flagos)
for its code generators by name only when it compiles, so nothing here is
imported before then.
"""

MESSAGE = (
    "flagos: torch.compile's default backend, inductor, has no code generation for the flagos device yet. "
    "Compile with backend='aot_eager' (or 'eager'): the graph is captured and runs on flagos's kernels.")

# The names inductor looks up on torch.flagos (torch/_inductor/codegen/common.py).
CODEGEN_NAMES = ("Scheduling", "PythonWrapperCodegen", "CppWrapperCodegen", "WrapperFxCodegen")


class _RaisesOnUse(type):
    # Inductor reads class attributes of a generator (supports_caching, ...)
    # before it makes one: any of them raises MESSAGE too.
    def __getattr__(cls, name):
        raise RuntimeError(MESSAGE)


class InductorUnsupported(metaclass=_RaisesOnUse):
    """Stands for every code generator: making or asking one raises MESSAGE."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError(MESSAGE)


def codegen_attribute():
    """What torch.flagos gives for each of CODEGEN_NAMES; also gives inductor
    the device-op table it reads before any generator (so it reaches ours)."""
    from torch._inductor.codegen.common import register_device_op_overrides
    from torch._inductor.codegen.cpu_device_op_overrides import CpuDeviceOpOverrides

    register_device_op_overrides("flagos", CpuDeviceOpOverrides())
    return InductorUnsupported
