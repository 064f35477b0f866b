"""flatten_parameters() for recurrent layers on flagos.

nn.RNNBase.flatten_parameters packs a layer's weights into one buffer, as
cuDNN lays them out, so that cuDNN reads them in place; it does so for CUDA
tensors only, and is a no-op for flagos ones. Without it cuDNN packs them
anew on every call (a copy of every weight): native CUDA's LSTM forward runs
at 0.57 of its speed with unflattened weights (docs/performance.md). With
the CUDA plugin active, flatten_parameters packs flagos weights too: the
native CUDA packing (`_cudnn_rnn_flatten_weight`) on native copies of the
weights gives the buffer and each weight's place in it; the flagos weights
are then set to those places in a flagos tensor over the buffer (the same
Parameter objects, as natively), and the layout is recorded for the
plugin's recurrent kernels (CudnnRecurrent.cpp), which hand cuDNN the
buffer while the weights still lie there. Layers on other devices take
PyTorch's own method, unchanged.
"""

import torch

import flagos_core

_original = None


def install():
    """Once, when the cuda runtime activates."""
    global _original
    if _original is not None:
        return
    _original = torch.nn.RNNBase.flatten_parameters

    def flatten_parameters(self):
        weights = self._flat_weights
        if weights and all(isinstance(w, torch.Tensor) and w.device.type == "flagos" for w in weights):
            _flatten_on_flagos(self)
        else:
            _original(self)

    flatten_parameters.__doc__ = _original.__doc__
    torch.nn.RNNBase.flatten_parameters = flatten_parameters


def _flatten_on_flagos(module):
    # PyTorch's conditions, asked about native aliases of the weights.
    weights = module._flat_weights
    if len(weights) != len(module._flat_weights_names):
        return
    natives = [flagos_core.as_native(w) for w in weights]
    dtype = weights[0].dtype
    if any(w.dtype != dtype or not torch.backends.cudnn.is_acceptable(n) for w, n in zip(weights, natives)):
        return
    if len({w.data_ptr() for w in weights}) != len(weights):  # aliasing weights: the copying path
        return
    from torch.backends.cudnn import rnn

    from . import _C

    with torch.cuda.device_of(natives[0]), torch.no_grad():
        if not torch._use_cudnn_rnn_flatten_weight():
            return
        per_layer = (4 if module.bias else 2) + (1 if module.proj_size > 0 else 0)
        mode = rnn.get_cudnn_mode(module.mode)
        # Native copies: the packing points them into its buffer.
        packed = [n.clone() for n in natives]
        buffer = torch._cudnn_rnn_flatten_weight(
            packed, per_layer, module.input_size, mode, module.hidden_size, module.proj_size, module.num_layers,
            module.batch_first, bool(module.bidirectional))
        flat = flagos_core.from_native(buffer, weights[0].device.index)
        storage = flat.untyped_storage()
        for w, p in zip(weights, packed):
            w.set_(storage, p.storage_offset(), p.size(), p.stride())
        if len({w.untyped_storage()._cdata for w in weights}) != 1:
            return  # not one buffer after all: cuDNN packs them per call, as before
        _C.register_flat_weights(
            list(weights), buffer.numel(), mode, module.input_size, module.hidden_size, module.proj_size,
            module.num_layers, bool(module.bidirectional), bool(module.bias))
