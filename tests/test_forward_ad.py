"""Forward-mode AD on flagos as on the native device. Where an input has no
tangent, PyTorch stands in a zero tensor (`_efficientzerotensor`: a
dispatch-key bit, no memory) and hands it to the kernels that test the bit
(copy_, dot, mul by a scalar). flagos's native aliases carry that bit as
they carry the conjugate and negative ones; without it a kernel read the
stand-in as a real tensor at a null pointer, and torch.func.hessian of
l1_loss killed the process."""

import pytest
import torch

from native_reference import compare_with_native

pytestmark = pytest.mark.native


def _forward_ad(device):
    # Self-contained: on an accelerator it runs in a side process.
    import torch.autograd.forward_ad as fwAD
    import torch.nn.functional as F

    torch.manual_seed(0)
    x, y, w = (torch.randn(4).to(device) for _ in range(3))
    results = [
        torch.func.hessian(lambda x: F.l1_loss(x, y) + (x ** 3).sum())(x),
        torch.func.jacfwd(lambda x: (x.sgn() * x).sum())(x),
        torch.func.jacfwd(lambda x: x @ w)(x),
        torch.func.jvp(lambda x, w: torch.dot(x, w), (x, w), (torch.ones_like(x), torch.zeros_like(w)))[1],
        torch.func.jacfwd(lambda x: torch.vdot(w, x))(x),
    ]
    with fwAD.dual_level():
        dual = fwAD.make_dual(x, torch.ones_like(x))
        results.append(fwAD.unpack_dual(torch.sgn(dual)).tangent)
    zero = torch._efficientzerotensor(4, device=device)
    results += [torch.randn(4).to(device).copy_(zero), torch.dot(zero, w).reshape(1), zero.mul(2.0) + 0]
    return results


def test_forward_ad_with_missing_tangents_equals_the_native_device(native_device, tmp_path):
    compare_with_native(_forward_ad, native_device, tmp_path)


def test_a_zero_tensor_stays_immutable():
    zero = torch._efficientzerotensor(4, device="flagos")
    assert zero._is_zerotensor()
    with pytest.raises(RuntimeError, match="ZeroTensors are immutable"):
        zero.zero_()
