"""Reads of a flagos tensor after it changed, through the native aliases calls take.

Every call passes a native alias of each flagos argument, set up from the
tensor's metadata and memory at that call. These tests change a tensor after
a first read, in every way PyTorch allows (in-place metadata ops, resize,
set_, .data), and check that later reads see the change exactly as CPU does;
that reading a tensor does not keep its memory alive after it dies; and that
many threads reading one tensor at once agree.
"""

import threading

import pytest
import torch

import flagos_core


def _pair(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    cpu = torch.randn(*shape, generator=g)
    return cpu, cpu.to("flagos")


def _check(flagos_value, cpu_value):
    assert flagos_value.device.type == "flagos"
    assert torch.equal(flagos_value.cpu(), cpu_value)


def test_reads_after_in_place_metadata_ops_see_the_new_geometry(native_device):
    cpu, dev = _pair(3, 4)
    native = cpu.to(native_device, copy=True)  # a sum adds in the native device's order
    _check(dev * 2, cpu * 2)  # a first read
    for op in (lambda t: t.t_(), lambda t: t.unsqueeze_(0), lambda t: t.squeeze_(0),
               lambda t: t.transpose_(0, 1), lambda t: t.as_strided_((2, 2), (1, 3), 1)):
        op(cpu)
        op(dev)
        op(native)
        assert dev.shape == cpu.shape and dev.stride() == cpu.stride()
        _check(dev + 1, cpu + 1)
        _check(dev.sum(0), native.sum(0).cpu())


def test_reads_after_resize_and_set_see_the_new_memory():
    cpu, dev = _pair(4)
    _check(dev + 1, cpu + 1)
    cpu.resize_(64).fill_(2.5)
    dev.resize_(64).fill_(2.5)  # a resize past the storage moves the data
    _check(dev * 3, cpu * 3)
    other_cpu, other_dev = _pair(5, seed=1)
    cpu.set_(other_cpu.untyped_storage(), 0, (5,), (1,))
    dev.set_(other_dev.untyped_storage(), 0, (5,), (1,))
    _check(dev - 1, cpu - 1)
    other_dev.mul_(2)  # dev shares other_dev's memory now
    other_cpu.mul_(2)
    _check(dev + 0, cpu + 0)


def test_data_assignment_and_detach():
    cpu, dev = _pair(2, 3)
    _check(dev + 1, cpu + 1)
    new_cpu, new_dev = _pair(3, 2, seed=2)
    cpu.data = new_cpu
    dev.data = new_dev
    _check(dev * 2, cpu * 2)
    det_cpu, det_dev = cpu.detach(), dev.detach()
    det_cpu.t_()
    det_dev.t_()  # the detached tensor changes; the original must not
    _check(dev + 1, cpu + 1)
    _check(det_dev + 1, det_cpu + 1)


def test_in_place_writes_reach_later_reads():
    cpu, dev = _pair(8)
    _check(dev + 0, cpu + 0)
    dev.add_(1)
    cpu.add_(1)
    dev[2:5] = 7.0
    cpu[2:5] = 7.0
    torch.mul(dev, 2, out=dev)
    torch.mul(cpu, 2, out=cpu)
    _check(dev + 0, cpu + 0)


def test_in_place_and_out_calls_on_views_and_with_scalars_match_cpu():
    # In-place and out= calls on flagos tensors only take the short path;
    # with a CPU scalar tensor or a CPU tensor they take the general one.
    cpu, dev = _pair(4, 6)
    other_cpu, other_dev = _pair(4, 6, seed=1)
    cpu[:, ::2].mul_(other_cpu[:, 1::2])  # strided views, written and read
    dev[:, ::2].mul_(other_dev[:, 1::2])
    _check(dev, cpu)
    torch.sub(cpu[:, 1], other_cpu[:, 3], alpha=3, out=cpu.t()[2])  # out= into a strided view
    torch.sub(dev[:, 1], other_dev[:, 3], alpha=3, out=dev.t()[2])
    _check(dev, cpu)
    cpu.add_(torch.tensor(0.5))  # a 0-dim CPU tensor is a scalar
    dev.add_(torch.tensor(0.5))
    _check(dev, cpu)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        dev.add_(other_cpu)
    _check(dev, cpu)  # the failed call changed nothing


def test_python_numbers_in_calls_match_cpu():
    # A Python number reaches the kernel as a wrapped CPU scalar tensor; the
    # short path passes it on as it is, in functional and in-place calls.
    cpu, dev = _pair(3, 5)
    with flagos_core.trace() as t:
        results = [dev + 1e-6, dev * 0.5, 2.0 - dev, dev / 3, torch.where(dev > 0, dev, 0.0), dev.pow(2)]
        written = dev.clone()
        written.mul_(0.25).add_(1, alpha=2)
    expected = [cpu + 1e-6, cpu * 0.5, 2.0 - cpu, cpu / 3, torch.where(cpu > 0, cpu, 0.0), cpu.pow(2)]
    for value, reference in zip(results, expected):
        _check(value, reference)
    _check(written, cpu.clone().mul_(0.25).add_(1, alpha=2))
    assert t.fallbacks == []
    # A 0-dim CPU tensor of the caller's is passed the same way and left as it was.
    scalar = torch.tensor(1.5)
    _check(dev + scalar, cpu + scalar)
    _check(dev.clone().sub_(scalar), cpu.clone().sub_(scalar))
    assert scalar.device.type == "cpu" and scalar.item() == 1.5


def test_a_result_over_an_arguments_memory_views_the_argument():
    # _unsafe_view's kernel makes a tensor over its argument's storage (not a
    # fresh one): the flagos result must be a view of the argument's flagos
    # memory, as CPU's result is of the CPU argument's.
    cpu, dev = _pair(2, 6)
    _check(dev + 1, cpu + 1)
    cpu_view = torch.ops.aten._unsafe_view(cpu, [3, 4])
    dev_view = torch.ops.aten._unsafe_view(dev, [3, 4])
    assert dev_view.shape == cpu_view.shape and dev_view.stride() == cpu_view.stride()
    assert dev_view.untyped_storage().data_ptr() == dev.untyped_storage().data_ptr()
    cpu_view.mul_(3)
    dev_view.mul_(3)
    _check(dev, cpu)  # the write through the view reached the argument


def test_a_tensor_that_was_read_frees_its_memory():
    torch.flagos.empty_cache()
    before = torch.flagos.memory_allocated()
    x = torch.ones(1 << 16, device="flagos")
    (x + 1).sum().item()  # x is read through an alias
    assert torch.flagos.memory_allocated() > before
    del x
    assert torch.flagos.memory_allocated() == before


@pytest.mark.parametrize("threads", [8])
def test_threads_read_one_tensor_together(threads):
    results, errors = [], []
    for round_ in range(20):
        cpu, dev = _pair(32, 32, seed=round_)
        barrier = threading.Barrier(threads)
        out = [None] * threads

        def read(i):
            try:
                barrier.wait()
                out[i] = (dev @ dev + i).cpu()
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(repr(e))

        pool = [threading.Thread(target=read, args=(i,)) for i in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join(timeout=60)
        results.append(all(torch.equal(out[i], cpu @ cpu + i) for i in range(threads)))
    assert not errors
    assert all(results)


def test_written_arguments_that_change_shape_stay_in_step():
    cpu, dev = _pair(6)
    out_cpu, out_dev = torch.zeros(2), torch.zeros(2, device="flagos")
    _check(out_dev + 0, out_cpu + 0)  # a first read of the out tensor
    out_cpu.resize_(0)  # as PyTorch asks before an out= that changes the shape
    out_dev.resize_(0)
    torch.add(cpu, 1, out=out_cpu)  # out= resizes its argument
    torch.add(dev, 1, out=out_dev)
    assert out_dev.shape == out_cpu.shape
    _check(out_dev * 2, out_cpu * 2)
    out_cpu.resize_(2, 3)
    out_dev.resize_(2, 3)  # within the storage: metadata only
    _check(out_dev.sum(1), out_cpu.sum(1))
    out_cpu.add_(out_cpu)
    out_dev.add_(out_dev)  # read and written in one call
    _check(out_dev + 0, out_cpu + 0)
    out_cpu.resize_(0)
    out_dev.resize_(0)
    torch.cat([cpu, cpu], out=out_cpu)
    torch.cat([dev, dev], out=out_dev)  # grows past the storage
    _check(out_dev - 1, out_cpu - 1)
