"""scaled_dot_product_attention on flagos picks the kernel the native device
picks for the same arguments, requires_grad included: CPU's flash kernel
cannot give a mask its gradient (T5's learned position bias is such a mask),
so there CPU takes the math path, and flagos must too."""

import pytest
import torch

from native_reference import compare_with_native

pytestmark = pytest.mark.native


def _attention(device):
    # Self-contained: on an accelerator it runs in a side process. Per case:
    # the output, then the gradients of the arguments that require one.
    results = []
    for mask_grad, qkv_grad in ((True, True), (False, True), (False, False)):
        torch.manual_seed(0)
        q, k, v = (torch.randn(2, 4, 8, 16).to(device).requires_grad_(qkv_grad) for _ in range(3))
        mask = torch.randn(1, 4, 8, 8).to(device).requires_grad_(mask_grad)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        results.append(out.detach())
        if qkv_grad or mask_grad:
            out.square().sum().backward()
            results += [t.grad for t in (q, k, v, mask) if t.requires_grad]
    return results


def test_attention_with_a_mask_that_requires_grad_matches_the_native_device(native_device, tmp_path):
    # Bitwise on the CPU. An accelerator's attention backward may add in a
    # varying order (atomics), from run to run natively as well.
    tolerance = {} if native_device.type == "cpu" else {"rtol": 1e-5, "atol": 1e-6}
    _, native = compare_with_native(_attention, native_device, tmp_path, **tolerance)
    assert len(native) == 10
