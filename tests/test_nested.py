"""Nested tensors on flagos (torch.nested, strided layout): the native
device's nested kernels on the same memory, results equal bitwise. The
inference fast path of nn.TransformerEncoder builds one from a padding mask,
so unchanged model code meets them without asking for them."""

import pytest
import torch
from native_reference import results_on_native


def nested_ops(device):
    torch.manual_seed(0)
    a, b = torch.randn(2, 4), torch.randn(3, 4)
    nt = torch.nested.nested_tensor([a, b], device=device)
    linear = torch.nn.Linear(4, 3).to(device)
    results = {
        "unbind": list(nt.unbind()),
        "add": (nt + nt).to_padded_tensor(0.0),
        "mul": (nt * 2).to_padded_tensor(0.0),
        "linear": linear(nt).to_padded_tensor(-1.0),
        "softmax": torch.softmax(nt, -1).to_padded_tensor(0.0),
        "relu_": nt.clone().relu_().to_padded_tensor(0.0),
        "as_nested_tensor": torch.nested.as_nested_tensor([a.to(device), b.to(device)]).to_padded_tensor(0.0),
        "bmm": torch.bmm(nt, nt.transpose(1, 2)).to_padded_tensor(0.0),
    }
    return nt, results


@pytest.mark.native
def test_nested_ops_equal_the_native_device(native_device):
    flagos_nt, flagos = nested_ops(torch.device("flagos"))
    _, native = nested_ops(native_device)
    assert flagos_nt.is_nested and flagos_nt.device.type == "flagos"
    assert flagos_nt._nested_tensor_size().device.type == "cpu"  # the sizes stay on the CPU, as natively
    for name, value in native.items():
        got = flagos[name] if isinstance(flagos[name], list) else [flagos[name]]
        want = value if isinstance(value, list) else [value]
        assert all(g.device.type == "flagos" for g in got), name
        assert all(torch.equal(g.cpu(), w.cpu()) for g, w in zip(got, want, strict=True)), name


@pytest.mark.native
def test_transformer_encoder_fast_path_with_a_padding_mask(native_device):
    # In eval mode with a padding mask, nn.TransformerEncoder turns its input
    # into a nested tensor and runs the fused encoder layer on it.
    def run(device):
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(16, 4, 32, batch_first=True)
        encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).eval().to(device)
        x = torch.randn(3, 6, 16)
        mask = torch.tensor([[False] * 6, [False] * 4 + [True] * 2, [False] * 2 + [True] * 4])
        with torch.no_grad():
            return encoder(x.to(device), src_key_padding_mask=mask.to(device))

    flagos, native = run(torch.device("flagos")), run(native_device)
    assert flagos.device.type == "flagos" and not flagos.is_nested
    assert torch.equal(flagos.cpu(), native.cpu())


@pytest.mark.native
def test_backward_through_nested_tensors(native_device, tmp_path):
    # The backward builds a nested gradient from a padded one and the nested
    # sizes, a CPU tensor on every device (`_nested_from_padded`).
    def grads(device):
        torch.manual_seed(0)
        linear = torch.nn.Linear(4, 3).to(device)
        nt = torch.nested.nested_tensor([torch.randn(2, 4), torch.randn(3, 4)], device=device, requires_grad=True)
        linear(nt).to_padded_tensor(0.0).square().sum().backward()
        assert nt.grad.is_nested and nt.grad.device.type == device.type
        return [linear.weight.grad, linear.bias.grad, *nt.grad.unbind()]

    flagos = grads(torch.device("flagos"))
    native = results_on_native(grads, native_device, tmp_path)
    assert all(torch.equal(f.cpu(), n.cpu()) for f, n in zip(flagos, native, strict=True))


def test_moving_a_nested_tensor_between_the_cpu_and_flagos():
    # The device argument says where the copy goes: on the host runtime the
    # native device is the CPU too, so the results' device alone cannot.
    a, b = torch.randn(2, 4), torch.randn(3, 4)
    cpu = torch.nested.nested_tensor([a, b])
    for move in (lambda t: t.to("flagos"), lambda t: t.flagos(), lambda t: t.to("flagos:0", copy=True),
                 lambda t: t.to("flagos", torch.float64)):
        moved = move(cpu)
        assert moved.is_nested and moved.device == torch.device("flagos:0")
        assert all(torch.equal(g.cpu(), w.to(moved.dtype)) for g, w in zip(moved.unbind(), (a, b), strict=True))
    on_flagos = torch.nested.nested_tensor([a, b], device="flagos")
    for move in (lambda t: t.cpu(), lambda t: t.to("cpu"), lambda t: t.to("cpu", torch.float16)):
        back = move(on_flagos)
        assert back.is_nested and back.device.type == "cpu"
        assert all(torch.equal(g, w.to(back.dtype)) for g, w in zip(back.unbind(), (a, b), strict=True))
    # A copy, not a view of the flagos memory.
    back = on_flagos.cpu()
    on_flagos.mul_(2)
    assert torch.equal(back.unbind()[0], a)
