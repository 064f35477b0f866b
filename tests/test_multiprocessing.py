"""flagos tensors through torch.multiprocessing: shared with the other
process as the native device's tensors are (writes on either side seen by
the other), compared with the native device's behaviour in the same
scenario. On the host runtime the storage moves into shared memory when
first sent (flagos_core/_multiprocessing.py)."""

from multiprocessing.reduction import ForkingPickler

import pytest
import torch
import torch.multiprocessing as mp

import flagos_core


def child(device, inbox, outbox, x, view, param):
    # x and view arrive as arguments (pickled at start), `later` through the queue.
    later = inbox.get(timeout=60)
    seen = [t.device.type for t in (x, view, param, later)]
    view.add_(10)  # a view sent on its own still writes x's memory
    param.data.mul_(2)
    later.fill_(7)
    outbox.put((seen, type(param).__name__, param.requires_grad, x.cpu()))
    outbox.put(torch.full((2,), 5.0, device=device))  # the other way: made here, read there
    inbox.get(timeout=60)  # kept alive until the parent has read it (needed for CUDA memory)


def scenario(device):
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    x = torch.arange(6.0, device=device)
    param = torch.nn.Parameter(torch.ones(3, device=device))
    later = torch.zeros(4, device=device)
    proc = ctx.Process(target=child, args=(device.type, inbox, outbox, x, x[2:5], param))
    proc.start()
    try:
        inbox.put(later)
        seen, param_type, requires_grad, child_x = outbox.get(timeout=120)
        from_child = outbox.get(timeout=60)
        result = {
            "devices seen by the child": seen,
            "parameter": (param_type, requires_grad),
            "x, as the child saw it": child_x,
            "x, here": x.cpu(),
            "parameter, here": param.detach().cpu(),
            "queued tensor, here": later.cpu(),
            "made by the child": (from_child.device.type, from_child.cpu()),
            "x + 1 here still works": (x + 1).cpu(),
        }
        inbox.put("done")
    finally:
        proc.join(60)
    assert proc.exitcode == 0
    return result


@pytest.mark.native
def test_tensors_are_shared_with_another_process_as_the_native_devices_are(native_device):
    flagos = scenario(torch.device("flagos"))
    native = scenario(native_device)
    want_x = torch.tensor([0.0, 1.0, 12.0, 13.0, 14.0, 5.0])
    assert flagos["devices seen by the child"] == ["flagos"] * 4
    assert flagos["parameter"] == ("Parameter", True)
    assert torch.equal(flagos["x, here"], want_x) and torch.equal(flagos["x, as the child saw it"], want_x)
    assert torch.equal(flagos["parameter, here"], torch.full((3,), 2.0))
    assert torch.equal(flagos["queued tensor, here"], torch.full((4,), 7.0))
    assert flagos["made by the child"][0] == "flagos"
    for key, value in native.items():
        if key == "devices seen by the child":
            assert value == [native_device.type] * 4
        elif key == "made by the child":
            assert torch.equal(flagos[key][1], value[1])
        elif isinstance(value, torch.Tensor):
            assert torch.equal(flagos[key], value), key
        else:
            assert flagos[key] == value, key


def test_a_non_leaf_that_requires_grad_is_refused_with_a_clear_error():
    leaf = torch.ones(2, device="flagos", requires_grad=True)
    with pytest.raises(RuntimeError, match="not a leaf.*detach"):
        ForkingPickler.dumps(leaf * 2)
    assert ForkingPickler.dumps(leaf)  # a leaf goes


def _add_one(weight):
    with torch.no_grad():
        weight.add_(1)


@pytest.mark.native
def test_share_memory_does_what_it_does_on_the_native_device(native_device):
    # torch moves CPU storages into shared memory and calls CUDA ones shared
    # as they are; host-runtime memory is host RAM, so it moves as the CPU's.
    def states(device):
        t = torch.zeros(4, device=device)
        before = t.is_shared()
        t.share_memory_()
        return before, t.is_shared()

    assert states("flagos") == states(native_device)


@pytest.mark.skipif(flagos_core.runtime()["name"] != "host", reason="a forked child cannot use CUDA")
def test_a_forked_child_writes_into_shared_memory_as_on_the_cpu():
    # Hogwild: model.share_memory(), then forked workers update the weights.
    # Before, flagos's share_memory_ did nothing and the child's writes were lost.
    model = torch.nn.Linear(2, 1, bias=False).to("flagos")
    with torch.no_grad():
        model.weight.zero_()
    model.share_memory()
    proc = mp.get_context("fork").Process(target=_add_one, args=(model.weight,))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    assert torch.equal(model.weight.detach().cpu(), torch.ones(1, 2))
    with pytest.raises(RuntimeError, match="not resizable"):  # shared memory has a fixed size, as on the CPU
        model.weight.data.resize_(100)
