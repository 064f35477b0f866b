"""Sparse and quantized tensors on flagos: not supported (flagos tensors are
strided and unquantized), so every way of making one raises an error that says
so and what to do instead, and the device keeps working afterwards. The same
calls succeed on the CPU, which is the reference for what "works" means.

A compressed sparse tensor (CSR, CSC, BSR, BSC) can be made on flagos, since
PyTorch builds it from dense parts: it keeps its parts readable and converts
(`.to_dense()`, `.cpu()`), and every computing op on it raises."""

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
    "a CPU CSR tensor moved to flagos, then added to": lambda: torch.eye(2).to_sparse_csr().to(DEVICE) + 1,
}


@pytest.mark.parametrize("case", sorted(SPARSE_CASES))
def test_sparse_tensors_raise_a_clear_error(case):
    with pytest.raises(NotImplementedError, match=r"(?s)flagos: aten::\S+ was called with a sparse tensor.*\.to_dense\(\)"):
        SPARSE_CASES[case]()


COMPRESSED_LAYOUTS = {
    "csr": lambda x: x.to_sparse_csr(),
    "csc": lambda x: x.to_sparse_csc(),
    "bsr": lambda x: x.to_sparse_bsr((2, 2)),
    "bsc": lambda x: x.to_sparse_bsc((2, 2)),
}


def _sparse_dense(*shape):
    torch.manual_seed(0)
    return torch.randn(*shape) * (torch.rand(*shape) > 0.5)


@pytest.mark.parametrize("batched", [False, True], ids=["2-d", "batched"])
@pytest.mark.parametrize("layout", sorted(COMPRESSED_LAYOUTS))
def test_a_compressed_sparse_tensor_on_flagos_keeps_its_parts_and_converts(layout, batched):
    cpu = COMPRESSED_LAYOUTS[layout](_sparse_dense(*((2, 6, 4) if batched else (6, 4))))
    on_flagos = cpu.to(DEVICE)
    assert on_flagos.layout == cpu.layout and on_flagos.device.type == DEVICE
    compressed, plain = {
        "csr": ("crow_indices", "col_indices"), "bsr": ("crow_indices", "col_indices"),
        "csc": ("ccol_indices", "row_indices"), "bsc": ("ccol_indices", "row_indices"),
    }[layout]
    for part in (compressed, plain, "values"):
        mine, reference = getattr(on_flagos, part)(), getattr(cpu, part)()
        assert mine.device.type == DEVICE and torch.equal(mine.cpu(), reference), part
    assert on_flagos._nnz() == cpu._nnz()
    dense = on_flagos.to_dense()
    assert dense.device.type == DEVICE and torch.equal(dense.cpu(), cpu.to_dense())
    back = on_flagos.cpu()
    assert back.layout == cpu.layout and torch.equal(back.to_dense(), cpu.to_dense())
    assert "nnz=" in repr(on_flagos)


def test_a_csr_tensor_made_on_flagos_converts():
    parts = torch.tensor([0, 1, 2]), torch.tensor([0, 1]), torch.tensor([1.0, 2.0])
    made = torch.sparse_csr_tensor(*parts, size=(2, 2), device=DEVICE)
    reference = torch.sparse_csr_tensor(*parts, size=(2, 2))
    assert torch.equal(made.to_dense().cpu(), reference.to_dense())
    assert torch.equal(made.t().to_dense().cpu(), reference.t().to_dense())


COMPUTING_OPS = {
    "add": lambda s: s + s,
    "mul": lambda s: s * 2,
    "mm": lambda s: s @ torch.ones(4, 3, device=s.device),
    "sum": lambda s: s.sum(),
    "clone": lambda s: s.clone(),
}


@pytest.mark.parametrize("op", sorted(COMPUTING_OPS))
def test_computing_on_a_compressed_sparse_tensor_raises_a_clear_error(op):
    cpu = _sparse_dense(6, 4).to_sparse_csr()
    COMPUTING_OPS[op](cpu)  # the CPU runs it
    with pytest.raises(NotImplementedError, match=r"(?s)flagos: aten::\S+ was called with a sparse tensor.*\.to_dense\(\)"):
        COMPUTING_OPS[op](cpu.to(DEVICE))


def test_a_cpu_sparse_tensor_beside_a_flagos_tensor_is_refused_for_its_device():
    # The flagos tensor picks the backend, so the call reaches flagos's
    # sparse kernel: the error names the devices, which are what is wrong.
    cpu = _sparse_dense(3, 3).to_sparse()
    dense = torch.ones(3, 3, device=DEVICE)
    for call in (lambda: cpu + dense, lambda: torch.sparse.mm(cpu, dense)):
        with pytest.raises(RuntimeError, match=r"sparse tensor on cpu and a tensor on a flagos device: a call's "
                                               r"tensors must be on one device"):
            call()


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
