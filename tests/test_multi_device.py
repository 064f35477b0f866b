"""Two flagos devices (FLAGOS_HOST_DEVICES=2), checked in a subprocess.

The device count is read when flagos_core is imported, so the checks run in a
fresh interpreter: this file is also a script. Run as `python test_multi_device.py`
it executes every `check_*` function below and prints one JSON line
{check name: "ok" or the traceback}. The pytest side starts that script once
and turns each entry into its own test.
"""

import io
import json
import os
import subprocess
import sys
import threading
import traceback

import pytest
import torch

MARKER = "FLAGOS_MULTI_DEVICE_RESULTS "


# --------------------------------------------------------------------------
# Checks: run only inside the subprocess with two host devices.
# --------------------------------------------------------------------------

def _raises(exc_type, fn):
    try:
        fn()
    except exc_type as e:
        return str(e)
    raise AssertionError(f"{fn} did not raise {exc_type.__name__}")


def check_device_count():
    import flagos_core
    assert torch.flagos.is_available()
    assert torch.flagos.device_count() == 2
    assert flagos_core.runtime()["device_count"] == 2
    assert torch.accelerator.device_count() == 2
    assert torch.flagos.current_device() == 0


def check_copy_between_devices_keeps_values():
    torch.manual_seed(0)
    ref = torch.randn(37, 19)
    x = ref.to("flagos:0")
    y = x.to("flagos:1")
    assert x.device == torch.device("flagos", 0)
    assert y.device == torch.device("flagos", 1)
    assert torch.equal(y.cpu(), ref)
    assert torch.equal(y.to("flagos:0").cpu(), ref)
    # Separate memory: writing the copy leaves the source alone.
    assert y.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    y.fill_(5.0)
    assert torch.equal(x.cpu(), ref)
    # Non-contiguous sources, dtype changes and copy_ across devices.
    t = x.t().to("flagos:1")
    assert t.device.index == 1 and torch.equal(t.cpu(), ref.t())
    d = x.to("flagos:1", torch.float64)
    assert d.dtype == torch.float64 and torch.equal(d.cpu(), ref.double())
    dst = torch.empty(37, 19, device="flagos:1")
    dst.copy_(x[:, :])
    assert torch.equal(dst.cpu(), ref)
    back = torch.zeros(19, 37, device="flagos:0")
    back.copy_(dst.t())
    assert torch.equal(back.cpu(), ref.t())


def check_set_device_moves_default_placement():
    assert torch.flagos.current_device() == 0
    assert torch.empty(2, device="flagos").device == torch.device("flagos", 0)
    torch.flagos.set_device(1)
    try:
        assert torch.flagos.current_device() == 1
        assert torch.accelerator.current_device_index() == 1
        before = (torch.flagos.memory_allocated(0), torch.flagos.memory_allocated(1))
        z = torch.empty(1024, device="flagos")
        assert z.device == torch.device("flagos", 1)
        assert torch.ones(3, device="flagos").device == torch.device("flagos", 1)
        assert torch.ones(3).to("flagos").device == torch.device("flagos", 1)
        assert torch.flagos.memory_allocated(0) == before[0]
        assert torch.flagos.memory_allocated(1) >= before[1] + 4096
        # An explicit index still wins.
        assert torch.empty(2, device="flagos:0").device == torch.device("flagos", 0)
    finally:
        torch.flagos.set_device(0)
    assert torch.flagos.current_device() == 0
    assert torch.empty(2, device="flagos").device == torch.device("flagos", 0)
    torch.flagos.set_device("flagos:1")
    assert torch.flagos.current_device() == 1
    torch.flagos.set_device(torch.device("flagos", 0))
    assert torch.flagos.current_device() == 0


def check_device_context_manager():
    with torch.flagos.device(1):
        assert torch.flagos.current_device() == 1
        assert torch.empty(4, device="flagos").device == torch.device("flagos", 1)
        assert torch.randn(4, device="flagos").device == torch.device("flagos", 1)
        with torch.flagos.device("flagos:0"):
            assert torch.flagos.current_device() == 0
            assert torch.empty(4, device="flagos").device == torch.device("flagos", 0)
        assert torch.flagos.current_device() == 1
    assert torch.flagos.current_device() == 0
    # Restored when the block raises.
    try:
        with torch.flagos.device(1):
            raise KeyError("boom")
    except KeyError:
        pass
    assert torch.flagos.current_device() == 0
    assert torch.empty(4, device="flagos").device == torch.device("flagos", 0)


def check_current_device_is_per_thread():
    seen = {}

    def worker():
        torch.flagos.set_device(1)
        seen["current"] = torch.flagos.current_device()
        seen["placed"] = torch.empty(1, device="flagos").device

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen == {"current": 1, "placed": torch.device("flagos", 1)}
    assert torch.flagos.current_device() == 0


def check_ops_run_on_their_inputs_device():
    torch.manual_seed(1)
    a_cpu, b_cpu = torch.randn(64, 64), torch.randn(64, 64)
    a, b = a_cpu.to("flagos:1"), b_cpu.to("flagos:1")
    assert torch.flagos.current_device() == 0
    mem0, mem1 = torch.flagos.memory_allocated(0), torch.flagos.memory_allocated(1)
    outs = {
        "add": (a + b, a_cpu + b_cpu),
        "mm": (a @ b, a_cpu @ b_cpu),
        "sum": (a.sum(dim=0), a_cpu.sum(dim=0)),
        "softmax": (torch.softmax(a, -1), torch.softmax(a_cpu, -1)),
        "cat": (torch.cat([a, b]), torch.cat([a_cpu, b_cpu])),
        "index": (a[b > 0], a_cpu[b_cpu > 0]),
    }
    for name, (got, want) in outs.items():
        assert got.device == torch.device("flagos", 1), name
        assert torch.equal(got.cpu(), want), name
    assert torch.flagos.memory_allocated(0) == mem0, "outputs of ops on flagos:1 must not use flagos:0 memory"
    assert torch.flagos.memory_allocated(1) > mem1
    assert torch.flagos.current_device() == 0


def check_autograd_on_second_device():
    torch.manual_seed(2)
    w_cpu = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(4, 8)
    w = w_cpu.detach().to("flagos:1").requires_grad_()
    (x @ w_cpu).relu().pow(2).sum().backward()
    (x.to("flagos:1") @ w).relu().pow(2).sum().backward()
    assert w.grad.device == torch.device("flagos", 1)
    assert torch.equal(w.grad.cpu(), w_cpu.grad)


def check_mixing_devices_raises():
    a = torch.ones(3, device="flagos:0")
    b = torch.ones(3, device="flagos:1")
    for op in (lambda: a + b, lambda: torch.mul(b, a), lambda: a.add_(b),
               lambda: torch.ones(3, 3, device="flagos:0") @ torch.ones(3, 3, device="flagos:1")):
        msg = _raises(RuntimeError, op)
        assert "Expected all tensors to be on the same device" in msg, msg
        assert "flagos:0" in msg and "flagos:1" in msg, msg
    assert torch.equal(a.cpu(), torch.ones(3)), "a failed in-place op must not write"


def check_invalid_index_is_a_clear_error():
    for make in (lambda: torch.ones(1, device="flagos:5"),
                 lambda: torch.empty(2, 2, device=torch.device("flagos", 5)),
                 lambda: torch.ones(2, device="flagos:0").to("flagos:5"),
                 lambda: torch.flagos.set_device(5),
                 lambda: torch.flagos.memory_allocated(5)):
        msg = _raises(RuntimeError, make)
        assert "flagos:5" in msg, msg
        assert "flagos:0" in msg and "flagos:1" in msg, f"the valid range is not named: {msg}"
    assert torch.flagos.current_device() == 0
    assert torch.equal(torch.ones(2, device="flagos:1").cpu(), torch.ones(2))


def check_each_device_has_its_own_generator():
    torch.flagos.manual_seed_all(0)
    torch.manual_seed(0)
    ref = torch.randn(16)
    torch.flagos.manual_seed_all(0)
    assert torch.equal(torch.flagos.get_rng_state(0), torch.flagos.get_rng_state(1))
    state1 = torch.flagos.get_rng_state(1)
    d0 = torch.randn(16, device="flagos:0")
    assert torch.equal(d0.cpu(), ref)
    # Drawing on flagos:0 advanced its own generator only.
    assert not torch.equal(torch.flagos.get_rng_state(0), state1)
    assert torch.equal(torch.flagos.get_rng_state(1), state1)
    d1 = torch.randn(16, device="flagos:1")
    assert torch.equal(d1.cpu(), ref)

    # manual_seed seeds the current device only.
    state0 = torch.flagos.get_rng_state(0)
    with torch.flagos.device(1):
        torch.flagos.manual_seed(123)
        assert torch.flagos.initial_seed() == 123
    assert torch.equal(torch.flagos.get_rng_state(0), state0)
    torch.manual_seed(123)
    assert torch.equal(torch.randn(8, device="flagos:1").cpu(), torch.randn(8))

    # Replaying one device's state does not disturb the other.
    saved = torch.flagos.get_rng_state(1)
    first = torch.rand(8, device="flagos:1").cpu()
    torch.rand(8, device="flagos:0")
    torch.flagos.set_rng_state(saved, 1)
    assert torch.equal(torch.rand(8, device="flagos:1").cpu(), first)
    torch.rand(8, device="flagos:0")  # so far both devices drew alike: now flagos:0 draws alone
    states = torch.flagos.get_rng_state_all()
    assert len(states) == 2 and not torch.equal(states[0], states[1])


def check_checkpoint_restores_the_generator_of_its_inputs_device():
    # flagos:1 owns its generator (flagos:0 shares the CPU one), so only a
    # stash of flagos:1's state, not of the CPU's, recomputes the same mask.
    # The mask comes from rand_like, an op that takes a generator: one that
    # takes none (dropout) draws from CPU's on further host devices.
    from torch.utils.checkpoint import checkpoint

    for reentrant in (False, True):
        torch.manual_seed(0)
        w = torch.randn(16, 16, device="flagos:1", requires_grad=True)
        x = torch.randn(4, 16, device="flagos:1", requires_grad=reentrant)

        def block(inp):
            hidden = torch.tanh(inp @ w)
            return (hidden * (torch.rand_like(hidden) < 0.5)) @ w

        torch.flagos.manual_seed_all(1)
        block(x).square().sum().backward()
        plain, w.grad = w.grad.clone(), None
        torch.flagos.manual_seed_all(1)
        checkpoint(block, x, use_reentrant=reentrant).square().sum().backward()
        assert torch.equal(w.grad.cpu(), plain.cpu()), f"use_reentrant={reentrant}"


def check_streams_and_events_per_device():
    assert torch.flagos.current_stream(1).device == torch.device("flagos", 1)
    s1 = torch.flagos.Stream(1)
    assert s1.device == torch.device("flagos", 1)
    with torch.flagos.device(1):
        e = torch.flagos.Event()
        e.record()
        e.synchronize()
        assert e.query()
    torch.flagos.synchronize(1)
    with torch.flagos.stream(s1):
        assert torch.flagos.current_stream(1) == s1
        x = torch.ones(4, device="flagos:1") * 2
    assert torch.equal(x.cpu(), torch.full((4,), 2.0))
    assert torch.flagos.current_stream(1) != s1
    # An event keeps the device it was first recorded on, as CUDA's does.
    e = torch.Event(device="flagos:1")
    e.record(s1)
    message = _raises(RuntimeError, lambda: e.record(torch.flagos.current_stream(0)))
    assert "Event device index 1 does not match recording stream's device index 0" in message


def check_stream_context_on_other_device_restores_current_device():
    # torch.cuda.stream(s) on another device switches the device for the block
    # and switches it back afterwards; torch.Stream's own `with s:` does too.
    s1 = torch.flagos.Stream(1)
    try:
        with s1:
            assert torch.flagos.current_device() == 1
        assert torch.flagos.current_device() == 0
        with torch.flagos.stream(s1):
            assert torch.flagos.current_device() == 1
            assert torch.empty(1, device="flagos").device == torch.device("flagos", 1)
        assert torch.flagos.current_device() == 0, (
            f"current device leaked to flagos:{torch.flagos.current_device()} "
            "after `with torch.flagos.stream(<stream on flagos:1>)`")
        assert torch.empty(1, device="flagos").device == torch.device("flagos", 0)
    finally:
        torch.flagos.set_device(0)  # leave a clean state for the later checks


def check_serialization_keeps_device_index():
    x = torch.arange(6.0, device="flagos:1")
    buf = io.BytesIO()
    torch.save({"x": x}, buf)
    buf.seek(0)
    y = torch.load(buf)["x"]
    assert y.device == torch.device("flagos", 1) and torch.equal(y.cpu(), torch.arange(6.0))
    buf.seek(0)
    z = torch.load(buf, map_location={"flagos:1": "flagos:0"})["x"]
    assert z.device == torch.device("flagos", 0) and torch.equal(z.cpu(), torch.arange(6.0))


def check_memory_is_per_device():
    import gc
    gc.collect()
    torch.flagos.empty_cache()
    m0, m1 = torch.flagos.memory_allocated(0), torch.flagos.memory_allocated(1)
    big = torch.empty(1 << 20, dtype=torch.uint8, device="flagos:1")
    assert torch.flagos.memory_allocated(1) - m1 >= 1 << 20
    assert torch.flagos.memory_allocated(0) == m0
    del big
    assert torch.flagos.memory_allocated(1) == m1
    assert torch.flagos.memory_reserved(1) >= m1 + (1 << 20)
    torch.flagos.empty_cache()
    assert torch.flagos.memory_reserved(1) == m1


def check_data_parallel_splits_the_batch_over_both_devices():
    # nn.DataParallel on the current accelerator's devices. With a CPU build
    # of torch that is flagos: replicas on flagos:0 and flagos:1, each given
    # half the batch, as CUDA's DataParallel does on two GPUs. With a CUDA
    # build it is CUDA, and torch.nn.parallel.comm stays torch's own.
    import copy
    import warnings

    from torch.nn.parallel import comm

    accelerator = torch.accelerator.current_accelerator()
    if accelerator.type != "flagos":
        chunks = comm.scatter(torch.arange(4.0), [0], dim=0)
        assert [c.device.type for c in chunks] == [accelerator.type]
        return
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    first_half_only = copy.deepcopy(ref)
    model = copy.deepcopy(ref).to("flagos")
    seen = set()
    model[0].register_forward_hook(lambda module, inputs, output: seen.add(inputs[0].device))
    x = torch.randn(10, 8)
    with warnings.catch_warnings():
        # torch's own, when it sums the replicas' gradients (on a CPU build, as with CUDA without NCCL)
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message="PyTorch is not compiled with NCCL support")
        y = torch.nn.DataParallel(model)(x.to("flagos"))
        y.pow(2).mean().backward()
    assert seen == {torch.device("flagos", 0), torch.device("flagos", 1)}
    # What each replica computes is the CPU model's on its half (batch norm
    # with the half's statistics); the gradients are the halves' summed.
    want = torch.cat([ref(half) for half in x.chunk(2)])
    want.pow(2).mean().backward()
    assert y.device == torch.device("flagos", 0) and torch.equal(y.detach().cpu(), want.detach())
    for got, expected in zip(model.parameters(), ref.parameters()):
        assert got.grad.device == torch.device("flagos", 0)
        torch.testing.assert_close(got.grad.cpu(), expected.grad, rtol=1e-6, atol=1e-7)
    # Running statistics: the replica on flagos:0 updates the model's own
    # buffers, from its half; the other replica's copies are dropped.
    first_half_only(x.chunk(2)[0])
    assert torch.equal(model[1].running_mean.cpu(), first_half_only[1].running_mean)
    # comm's functions directly: a device's own tensor is not copied.
    t = torch.arange(6.0, device="flagos:0")
    a, b = comm.broadcast(t, [0, 1])
    assert a is t and b.device == torch.device("flagos", 1) and torch.equal(b.cpu(), t.cpu())
    parts = comm.scatter(t, [1, 0], chunk_sizes=[4, 2])
    assert [p.device.index for p in parts] == [1, 0] and parts[1].data_ptr() == t[4:].data_ptr()
    assert torch.equal(comm.gather(parts, destination=-1), t.cpu())
    assert comm.gather(parts, destination=1).device == torch.device("flagos", 1)
    # Complex tensors cross as their real views (comm.py's own handling), and come back complex.
    z = torch.randn(6, 2, dtype=torch.complex64)
    halves = torch.nn.parallel.scatter(z.to("flagos"), [0, 1])
    assert [h.device.index for h in halves] == [0, 1] and all(h.dtype == torch.complex64 for h in halves)
    assert torch.equal(torch.nn.parallel.gather(halves, "cpu"), z)
    # An output of another shape is refused (copy_ would have broadcast into it), naming the shapes.
    message = _raises(RuntimeError, lambda: comm.broadcast(torch.ones(3, device="flagos:0"),
                                                           out=[torch.empty(2, 3, device="flagos:1")]))
    assert "(2, 3)" in message and "(3,)" in message


def check_data_parallel_runs_its_replicas_under_the_callers_autocast():
    # torch's parallel_apply passes CUDA's autocast flag to its threads: the
    # replicas on flagos devices ran in float32 under autocast("flagos").
    model = torch.nn.Linear(4, 4).to("flagos")
    x = torch.randn(4, 4, device="flagos")
    dp = torch.nn.DataParallel(model, device_ids=[0, 1])
    with torch.autocast("flagos", dtype=torch.bfloat16):
        want = model(x)
        got = dp(x)
    assert got.dtype == want.dtype == torch.bfloat16
    assert torch.equal(got.cpu(), want.cpu())  # each half, as the whole batch's rows
    assert dp(x).dtype == torch.float32  # and without autocast, none


def check_cpu_fallback_refuses_mixed_devices_as_the_host_provider_does():
    # cpu_fallback copies arguments to the CPU: it took tensors of two
    # devices (and non-scalar CPU tensors) and gave the first one's device.
    import flagos_core

    a, b = torch.ones(2, device="flagos:0"), torch.full((2,), 3.0, device="flagos:1")
    flagos_core.set_route("mul.Tensor", "cpu_fallback")
    try:
        for call, devices in ((lambda: a * b, "flagos:0 and flagos:1"), (lambda: b * torch.ones(2), "flagos:1 and cpu")):
            message = _raises(RuntimeError, call)
            assert f"Expected all tensors to be on the same device, but found at least two devices, {devices}" in message
        assert torch.equal((b * torch.tensor(2.0)).cpu(), torch.full((2,), 6.0))  # a CPU scalar is read
        assert (b * 2).device == torch.device("flagos", 1)
    finally:
        flagos_core.clear_route("mul.Tensor")


def check_convolution_refuses_another_devices_weight():
    # The forward took a CPU or flagos:1 weight as flagos:0's (only its
    # backward went through the router's device check).
    import torch.nn.functional as F

    x = torch.randn(1, 2, 8, 8, device="flagos:0")
    for weight, bias, named in ((torch.randn(3, 2, 3, 3, device="flagos:1"), None, "flagos:1"),
                                (torch.randn(3, 2, 3, 3), None, "cpu"),
                                (torch.randn(3, 2, 3, 3, device="flagos:0"), torch.randn(3), "cpu")):
        message = _raises(RuntimeError, lambda: F.conv2d(x, weight, bias))
        assert "Expected all tensors to be on the same device" in message and named in message, message
    with torch.no_grad():  # a module left on the CPU, under inference as well
        assert "Expected all tensors" in _raises(RuntimeError, lambda: torch.nn.Conv2d(2, 3, 3)(x))


def check_device_contexts_as_torch_cuda():
    # A negative index (a CPU tensor's get_device()) selects nothing;
    # device_of and StreamContext as torch.cuda has them.
    torch.flagos.set_device(-1)
    assert torch.flagos.current_device() == 0
    with torch.flagos.device(-1), torch.flagos.device_of(torch.ones(1)):
        assert torch.flagos.current_device() == 0
    with torch.flagos.device_of(torch.ones(1, device="flagos:1")):
        assert torch.flagos.current_device() == 1
    assert torch.flagos.current_device() == 0
    # torch.cuda.device's attributes.
    context = torch.flagos.device(1)
    assert context.idx == 1 and torch.flagos.device(-1).idx == -1 and torch.flagos.device_of(torch.ones(1)).idx == -1
    with context:
        assert context.prev_idx == 0
    s = torch.flagos.Stream(1)
    with torch.flagos.StreamContext(s):
        assert torch.flagos.current_stream(1) == s and torch.flagos.current_device() == 1
    with torch.flagos.StreamContext(None):
        assert torch.flagos.current_device() == 0
    assert torch.flagos.current_device() == 0 and torch.flagos.current_stream(1) != s


def check_generators_pickle_and_copy():
    # Every flagos device's generator, pickled, deep-copied and saved, draws
    # on from where the original is (they raised: torch reads an offset,
    # which the CPU generator behind them has not).
    import copy
    import pickle

    for index in (0, 1):
        gen = torch.Generator(f"flagos:{index}").manual_seed(3)
        torch.randn(3, device=f"flagos:{index}", generator=gen)
        buffer = io.BytesIO()
        torch.save(gen, buffer)
        buffer.seek(0)
        copies = [pickle.loads(pickle.dumps(gen)), copy.deepcopy(gen), torch.load(buffer, weights_only=False)]
        want = torch.randn(4, device=f"flagos:{index}", generator=gen).cpu()
        for made in copies:
            assert made.device == torch.device("flagos", index)
            assert torch.equal(torch.randn(4, device=f"flagos:{index}", generator=made).cpu(), want)


def check_compiled_results_stay_on_their_own_devices():
    # Inductor's results came back all on one device: the first flagos
    # input's, or flagos:0 without one.
    x = torch.randn(3)
    cases = [(lambda p: p.to("flagos:0") * 2, (x.to("flagos:1"),)),
             (lambda: torch.arange(4, device="flagos:1"), ()),
             (lambda p, q: (p.to(q.device) + q, p * 2), (x.to("flagos:0"), x.to("flagos:1")))]
    for fn, args in cases:
        torch._dynamo.reset()
        want, got = fn(*args), torch.compile(fn)(*args)
        want, got = (want, got) if isinstance(want, tuple) else ((want,), (got,))
        assert [t.device for t in got] == [t.device for t in want]
        assert all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(got, want))


CHECKS = [name for name in list(globals()) if name.startswith("check_")]


def _main():
    import flagos_core  # noqa: F401
    results = {}
    for name in CHECKS:
        try:
            torch.flagos.set_device(0)  # each check starts on flagos:0
            globals()[name]()
            results[name] = "ok"
        except BaseException:  # noqa: BLE001 - report everything back to pytest
            results[name] = traceback.format_exc()
    sys.stdout.write(MARKER + json.dumps(results) + "\n")
    sys.stdout.flush()
    # Skip interpreter teardown: with torch 2.13 a process that ran backward on
    # a non-CPU device can abort at exit (autograd device-thread race, reported
    # separately); that must not hide the results printed above.
    os._exit(0)


# --------------------------------------------------------------------------
# pytest side
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def results():
    # The host runtime's two devices, whatever plugin is installed here.
    env = dict(os.environ, FLAGOS_HOST_DEVICES="2", FLAGOS_RUNTIME="host", FLAGOS_DISCOVER_PLUGINS="0")
    proc = subprocess.run([sys.executable, os.path.abspath(__file__)], env=env,
                          capture_output=True, text=True, timeout=120)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARKER)]
    assert proc.returncode == 0 and lines, (
        f"the two-device subprocess failed (rc={proc.returncode})\n"
        f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len(MARKER):])


@pytest.mark.parametrize("check", CHECKS)
def test_two_devices(results, check):
    assert check in results, f"{check} did not report"
    assert results[check] == "ok", results[check]


if __name__ == "__main__":
    _main()
