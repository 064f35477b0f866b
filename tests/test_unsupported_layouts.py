"""Sparse and quantized tensors on flagos: not supported (flagos tensors are
strided and unquantized), so every way of making one raises an error that says
so and what to do instead, and the device keeps working afterwards. The same
calls succeed on the CPU, which is the reference for what "works" means."""

import warnings

import pytest
import torch

import flagos_core  # noqa: F401  (registers the flagos device)

DEVICE = "flagos"


def _coo(device):
    return torch.sparse_coo_tensor(torch.tensor([[0, 1], [1, 0]]), torch.tensor([1.0, 2.0]), (2, 2), device=device)


def _quantized(x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized creation warns of its deprecation
        return torch.quantize_per_tensor(x, 0.1, 0, torch.qint8)


SPARSE_CASES = {
    "sparse_coo_tensor on flagos": lambda: _coo(DEVICE),
    "a CPU sparse tensor moved to flagos": lambda: _coo("cpu").to(DEVICE),
    "a CPU CSR tensor moved to flagos, then used": lambda: torch.eye(2).to_sparse_csr().to(DEVICE)._nnz(),
}


@pytest.mark.parametrize("case", sorted(SPARSE_CASES))
def test_sparse_tensors_raise_a_clear_error(case):
    with pytest.raises(NotImplementedError, match=r"(?s)flagos: aten::\S+ was called with a sparse tensor.*\.to_dense\(\)"):
        SPARSE_CASES[case]()


def test_a_kernel_with_a_sparse_result_raises_a_clear_error():
    assert torch.eye(2).to_sparse().is_sparse  # the CPU makes one
    with pytest.raises(RuntimeError, match=r"aten::_to_sparse returned a Sparse tensor, and flagos holds strided"):
        torch.eye(2, device=DEVICE).to_sparse()


def test_quantizing_a_flagos_tensor_raises_a_clear_error():
    x = torch.randn(4)
    assert _quantized(x).is_quantized  # the CPU quantizes
    with pytest.raises(NotImplementedError, match=r"returned a quantized tensor.*\.dequantize\(\)"):
        _quantized(x.to(DEVICE))


def test_moving_a_quantized_tensor_to_flagos_raises_a_clear_error():
    q = _quantized(torch.randn(4))
    with pytest.raises(NotImplementedError, match=r"was called with a quantized tensor.*\.dequantize\(\)"):
        q.to(DEVICE)
    # What the message suggests works, and gives the CPU's values.
    assert torch.equal(q.dequantize().to(DEVICE).cpu(), q.dequantize())


def test_the_device_keeps_working_after_these_errors():
    for make in list(SPARSE_CASES.values()) + [lambda: _quantized(torch.randn(4, device=DEVICE))]:
        with pytest.raises((NotImplementedError, RuntimeError)):
            make()
    a = torch.arange(6.0).reshape(2, 3)
    assert torch.equal((a.to(DEVICE) * 2 + 1).cpu(), a * 2 + 1)
