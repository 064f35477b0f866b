"""Calls with tensor-list arguments (foreach ops, cat) against the native device.

A list's flagos elements reach the kernel as an array of borrowed native
aliases (the call's records own them), and after the kernel only the
arguments the schema writes are checked for a resize. These tests cover what
that must still get right: lists of views, one tensor twice in a list,
written lists beside read ones, an out= list the kernel resizes (a boxed
overload), a list longer than the per-thread alias pool, an error raised in
the middle of a call, and elements of another device.
"""

import pytest
import torch

import flagos_core  # noqa: F401

pytestmark = pytest.mark.native


def _lists(native, count, seed, shape=(5,)):
    g = torch.Generator().manual_seed(seed)
    made = [torch.randn(*shape, generator=g) for _ in range(count)]
    return [t.to(native) for t in made], [t.to("flagos") for t in made]


def _same(flagos_tensors, native_tensors):
    assert len(flagos_tensors) == len(native_tensors)
    for got, want in zip(flagos_tensors, native_tensors):
        assert got.device.type == "flagos"
        assert got.shape == want.shape and got.stride() == want.stride()
        assert torch.equal(got.cpu(), want.cpu())


def test_foreach_in_place_on_views_and_on_one_tensor_twice(native_device):
    base_n, base_f = _lists(native_device, 1, seed=0, shape=(6, 8))
    # A transposed view, a strided slice with an offset, a row, and the
    # first view again: one tensor twice in a written list.
    views_n = [base_n[0].t(), base_n[0][1::2, 3:], base_n[0][4], base_n[0].t()]
    views_f = [base_f[0].t(), base_f[0][1::2, 3:], base_f[0][4], base_f[0].t()]
    torch._foreach_mul_(views_n, 1.5)
    torch._foreach_mul_(views_f, 1.5)
    _same(views_f, views_n)
    _same(base_f, base_n)


def test_foreach_three_lists_write_the_first_and_leave_the_others(native_device):
    xs_n, xs_f = _lists(native_device, 7, seed=1)
    ys_n, ys_f = _lists(native_device, 7, seed=2)
    zs_n, zs_f = _lists(native_device, 7, seed=3)
    zs_n = [z.abs() + 1 for z in zs_n]
    zs_f = [z.abs() + 1 for z in zs_f]
    ys_before = [y.cpu() for y in ys_f]
    torch._foreach_addcdiv_(xs_n, ys_n, zs_n, value=0.25)
    torch._foreach_addcdiv_(xs_f, ys_f, zs_f, value=0.25)
    _same(xs_f, xs_n)
    _same(zs_f, zs_n)
    assert all(torch.equal(y.cpu(), before) for y, before in zip(ys_f, ys_before))


def test_foreach_results_are_new_flagos_tensors(native_device):
    xs_n, xs_f = _lists(native_device, 5, seed=4)
    ys_n, ys_f = _lists(native_device, 5, seed=5)
    sums_f = torch._foreach_add(xs_f, ys_f, alpha=2)
    _same(sums_f, torch._foreach_add(xs_n, ys_n, alpha=2))
    for result, x in zip(sums_f, xs_f):
        assert result.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


def test_an_out_list_is_resized_as_on_the_native_device(native_device):
    xs_n, xs_f = _lists(native_device, 4, seed=6, shape=(3, 2))
    outs_n = [torch.empty(0, device=native_device) for _ in xs_n]
    outs_f = [torch.empty(0, device="flagos") for _ in xs_f]
    torch.ops.aten._foreach_add.Scalar_out(xs_n, 2.0, out=outs_n)
    torch.ops.aten._foreach_add.Scalar_out(xs_f, 2.0, out=outs_f)
    _same(outs_f, outs_n)
    _same([o * 3 for o in outs_f], [o * 3 for o in outs_n])  # later reads see the new memory


def test_a_list_longer_than_the_alias_pool(native_device):
    # The pool keeps up to 1024 aliases per thread; beyond that aliases are
    # made afresh and freed by refcounting.
    xs_n, xs_f = _lists(native_device, 1500, seed=7, shape=(2,))
    ys_n, ys_f = _lists(native_device, 1500, seed=8, shape=(2,))
    for _ in range(2):  # the second call runs on the aliases the first gave back
        torch._foreach_lerp_(xs_n, ys_n, 0.3)
        torch._foreach_lerp_(xs_f, ys_f, 0.3)
    _same(xs_f, xs_n)
    _same(ys_f, ys_n)


def test_an_error_inside_a_list_call_leaves_the_tensors_and_the_next_call_intact(native_device):
    xs_n, xs_f = _lists(native_device, 3, seed=9)
    ys_n, ys_f = _lists(native_device, 2, seed=10)
    before = [x.cpu() for x in xs_f]
    with pytest.raises(RuntimeError):
        torch._foreach_add_(xs_f, ys_f)  # lists of different lengths
    assert all(torch.equal(x.cpu(), b) for x, b in zip(xs_f, before))
    torch._foreach_add_(xs_n[:2], ys_n)
    torch._foreach_add_(xs_f[:2], ys_f)
    _same(xs_f, xs_n)


def test_cat_of_views_and_a_tensor_of_another_device(native_device):
    a_n, a_f = _lists(native_device, 1, seed=11, shape=(4, 6))
    parts_n = [a_n[0][:, 1:3], a_n[0][::2].t().t(), a_n[0][3:]]
    parts_f = [a_f[0][:, 1:3], a_f[0][::2].t().t(), a_f[0][3:]]
    _same([torch.cat(parts_f[1:], dim=0)], [torch.cat(parts_n[1:], dim=0)])
    _same([torch.cat([parts_f[0], parts_f[0]], dim=1)], [torch.cat([parts_n[0], parts_n[0]], dim=1)])
    with pytest.raises(RuntimeError, match="same device"):
        torch.cat([a_f[0], torch.ones(4, 6)])


def test_foreach_lists_with_a_cpu_tensor_raise_and_leave_it_unwritten():
    # Natively each index is one tensor op: a CPU tensor beside a device
    # tensor raises there, unless it is a 0-dim scalar that is read. flagos
    # ran CPU's foreach kernel, which took the CPU tensor, and wrote it.
    cpu, f = torch.zeros(3), torch.ones(3, device="flagos")
    with pytest.raises(RuntimeError, match="same device"):
        torch._foreach_add_([cpu], [f])
    with pytest.raises(RuntimeError, match="same device"):
        torch._foreach_mul([f, cpu], 2.0)
    with pytest.raises(RuntimeError, match="same device"):
        torch._foreach_add_([f], [torch.ones(3)])
    assert torch.equal(cpu, torch.zeros(3)) and torch.equal(f.cpu(), torch.ones(3))
    torch._foreach_add_([f], [torch.tensor(2.0)])  # a 0-dim CPU scalar, read: as natively
    assert torch.equal(f.cpu(), torch.full((3,), 3.0))
