"""torch.flagos.FloatTensor and the other legacy tensor types, as torch.cuda
has them. `Tensor.type()` names a flagos tensor's type so
(`torch.flagos.FloatTensor`), and older code ported from CUDA tests or
builds tensors with them (`isinstance(x, torch.cuda.FloatTensor)`,
`torch.cuda.LongTensor(3)`, `torch.cuda.FloatTensor([1, 2])`). PyTorch
makes such types only for CPU and CUDA, so flagos defines its own: an
instance check by device, dtype and layout, and a constructor taking sizes,
a `torch.Size`, data or a tensor of the type itself, as the legacy
constructors do.
"""

import torch

_DTYPES = {
    "FloatTensor": torch.float32, "DoubleTensor": torch.float64, "HalfTensor": torch.float16,
    "BFloat16Tensor": torch.bfloat16, "ByteTensor": torch.uint8, "CharTensor": torch.int8,
    "ShortTensor": torch.int16, "IntTensor": torch.int32, "LongTensor": torch.int64, "BoolTensor": torch.bool,
}


class _LegacyTensorType(type):
    def __instancecheck__(cls, obj):
        return (isinstance(obj, torch.Tensor) and obj.device.type == "flagos" and obj.dtype == cls.dtype
                and obj.layout == torch.strided)

    def __call__(cls, *args, device=None):
        device = torch.device("flagos") if device is None else torch.device(device)
        if device.type != "flagos":
            raise RuntimeError(f"{cls.__module__}.{cls.__qualname__} makes flagos tensors, not tensors on {device}")
        if not args:
            return torch.empty(0, dtype=cls.dtype, device=device)
        if all(isinstance(a, int) for a in args) or (len(args) == 1 and isinstance(args[0], torch.Size)):
            return torch.empty(*args, dtype=cls.dtype, device=device)
        if len(args) == 1 and isinstance(args[0], torch.Tensor):
            if not isinstance(args[0], cls):
                raise TypeError(f"{cls.__module__}.{cls.__qualname__}(tensor) takes a tensor of that type, got "
                                f"{args[0].type()}; use .to(device, dtype) to convert")
            return args[0]
        if len(args) == 1:
            return torch.tensor(args[0], dtype=cls.dtype, device=device)
        raise TypeError(f"{cls.__module__}.{cls.__qualname__}() takes sizes, a torch.Size, data or a tensor, "
                        f"got {tuple(type(a).__name__ for a in args)}")


def install(module):
    """Adds the types to torch.flagos (`module`), named as Tensor.type() names them."""
    for name, dtype in _DTYPES.items():
        # The full name is the type's C name, which Tensor.type(cls) and
        # Module.type(cls) parse (as CUDA's C-made types give theirs); the
        # qualified name stays short, so the repr is torch.flagos.FloatTensor.
        setattr(module, name, _LegacyTensorType(f"torch.flagos.{name}", (), {
            "dtype": dtype, "is_cuda": False, "__module__": "torch.flagos", "__qualname__": name}))
