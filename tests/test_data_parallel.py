"""nn.DataParallel on flagos with a CPU build of torch, one device (two
devices: tests/test_multi_device.py). torch.nn.parallel's copies between
devices are CUDA's C++ functions, which a CPU build lacks; flagos serves
them where flagos is the accelerator."""

import copy
import warnings

import pytest
import torch

flagos_is_the_accelerator = pytest.mark.skipif(
    torch.accelerator.current_accelerator() is None or torch.accelerator.current_accelerator().type != "flagos",
    reason="with a CUDA build of torch, DataParallel runs on the CUDA accelerator (docs/usage.md)")


@flagos_is_the_accelerator
def test_data_parallel_on_one_device_trains_as_the_cpu_model_does():
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    model = torch.nn.DataParallel(copy.deepcopy(ref).to("flagos"))
    assert model.device_ids == [0]
    x = torch.randn(10, 8)
    for step in range(2):
        inputs = x.to("flagos") if step == 0 else x  # a CPU batch is copied over, as to a GPU
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # nothing to warn about on one device
            y = model(inputs)
        y.pow(2).mean().backward()
        want = ref(x)
        want.pow(2).mean().backward()
        assert y.device == torch.device("flagos", 0)
        assert torch.equal(y.detach().cpu(), want.detach())
    for got, expected in zip(model.module.parameters(), ref.parameters()):
        assert torch.equal(got.grad.cpu(), expected.grad)
    assert torch.equal(model.module[1].running_mean.cpu(), ref[1].running_mean)


@flagos_is_the_accelerator
def test_data_parallel_takes_complex_tensors():
    # torch.nn.parallel passes complex tensors between devices as their real views.
    torch.manual_seed(0)
    ref = torch.nn.Linear(4, 3, dtype=torch.complex64)
    model = torch.nn.DataParallel(copy.deepcopy(ref).to("flagos"))
    x = torch.randn(5, 4, dtype=torch.complex64)
    y = model(x.to("flagos"))
    assert y.dtype == torch.complex64 and y.device == torch.device("flagos", 0)
    assert torch.equal(y.detach().cpu(), ref(x).detach())
