"""Many threads using the same flagos tensors at once get the native device's
results (CPU's on the host runtime).

A relabel provider runs native kernels on zero-copy aliases of flagos
tensors; the aliasing must never touch the shared tensors themselves (their
device, storage or metadata), however many threads read them at the same
time. The tests marked native run on the GPU too (scripts/gpu-check).
"""

import gc
import threading

import pytest
import torch

import flagos_core  # noqa: F401
from native_reference import results_on_native

THREADS = 8
ITERATIONS = 400


def _run_threads(target, n=THREADS):
    """Start n threads on target(tid) behind a barrier; return their exceptions."""
    barrier = threading.Barrier(n)
    errors = []

    def wrapper(tid):
        try:
            barrier.wait()
            target(tid)
        except BaseException as e:  # noqa: BLE001 - reported to the main thread
            errors.append((tid, repr(e)))

    threads = [threading.Thread(target=wrapper, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a worker thread hung"
    return errors


@pytest.fixture(scope="module")
def shared():
    torch.manual_seed(0)
    cpu = {"a": torch.randn(48, 48), "b": torch.randn(48, 48), "v": torch.randn(48),
           "idx": torch.randint(0, 48, (20,))}
    dev = {k: t.to("flagos") for k, t in cpu.items()}
    return cpu, dev


def _programs(a, b, v, idx):
    """The same computations, written once for CPU and flagos inputs."""
    return {
        "matmul": lambda: a @ b,
        "mv": lambda: torch.mv(a, v),
        "add": lambda: a + b * 2,
        "broadcast": lambda: a + v,
        "transpose_view": lambda: a.t() @ b[:, :7],
        "slice_view": lambda: a[3:40:3, ::2].sum(dim=0),
        "flat_view": lambda: a.view(-1)[100:900].reshape(20, 40).softmax(dim=1),
        "expand": lambda: v.unsqueeze(0).expand(5, 48) * a[:5],
        "index": lambda: a.index_select(0, idx) - b[idx],
        "reduce": lambda: torch.stack([a.sum(), a.mean(), b.amax(), (a * b).sum()]),
        "private_inplace": lambda: a.clone().mul_(3).add_(b).clamp_(-1, 1).t_().contiguous(),
        "private_view_inplace": lambda: _view_write(a),
        "out_variant": lambda: torch.add(a, b, out=torch.empty(0, device=a.device)),
    }


def _view_write(a):
    p = a.clone()
    p[::2, 1::3].fill_(7.0)
    p.diagonal().zero_()
    return p


@pytest.mark.native
def test_concurrent_ops_on_shared_tensors_match_cpu(shared, native_device):
    cpu, dev = shared
    native = {k: t.to(native_device) for k, t in cpu.items()}  # CPU on the host runtime
    expected = {k: fn().cpu() for k, fn in _programs(native["a"], native["b"], native["v"], native["idx"]).items()}
    snapshot = {k: (t.device, t.untyped_storage().data_ptr(), t.shape, t.stride(), t.storage_offset())
                for k, t in dev.items()}
    mismatches = []

    def work(tid):
        progs = _programs(dev["a"], dev["b"], dev["v"], dev["idx"])
        names = list(progs)
        for it in range(ITERATIONS):
            name = names[(tid + it) % len(names)]  # threads run different ops at the same moment
            out = progs[name]()
            if out.device.type != "flagos":
                mismatches.append((tid, it, name, f"result on {out.device}"))
            elif not torch.equal(out.cpu(), expected[name]):
                mismatches.append((tid, it, name, "values differ from CPU"))

    errors = _run_threads(work)
    assert errors == []
    assert mismatches == [], mismatches[:10]
    # The shared tensors are exactly as they were: same device, memory, layout, values.
    for k, t in dev.items():
        assert (t.device, t.untyped_storage().data_ptr(), t.shape, t.stride(), t.storage_offset()) == snapshot[k]
        assert t.is_flagos
        assert torch.equal(t.cpu(), cpu[k])


def test_shared_tensor_never_looks_relabelled(shared):
    """While other threads compute on it, a shared tensor always reads as flagos."""
    cpu, dev = shared
    a, b = dev["a"], dev["b"]
    stop = threading.Event()
    seen = []

    def observer():
        while not stop.is_set():
            if a.device.type != "flagos" or not a.is_flagos or b.device.type != "flagos":
                seen.append((a.device, b.device))

    obs = threading.Thread(target=observer)
    obs.start()
    try:
        def work(tid):
            for _ in range(ITERATIONS):
                (a @ b).add_(a).sum()
                a.t().contiguous()
        errors = _run_threads(work, n=THREADS - 1)
    finally:
        stop.set()
        obs.join()
    assert errors == []
    assert seen == []


def test_concurrent_in_place_on_disjoint_views_of_one_tensor():
    """Threads writing disjoint rows of one shared flagos tensor leave CPU-identical data."""
    torch.manual_seed(3)
    src = torch.randn(THREADS * 4, 64)
    shared_dev = torch.zeros(THREADS * 4, 64, device="flagos")
    src_dev = src.to("flagos")

    def work(tid):
        rows = slice(tid * 4, tid * 4 + 4)
        for it in range(ITERATIONS):
            view = shared_dev[rows]
            view.copy_(src_dev[rows]).mul_(it % 3 + 1).sub_(src_dev[rows] * (it % 3))

    errors = _run_threads(work)
    assert errors == []
    k = (ITERATIONS - 1) % 3  # each iteration overwrites its rows; the last one stays
    expected = src.clone().mul_(k + 1).sub_(src * k)
    assert torch.equal(shared_dev.cpu(), expected)
    assert torch.equal(src_dev.cpu(), src)


def _one_gradient_per_input(device, inputs):
    # Self-contained: on an accelerator it runs in a side process.
    torch.manual_seed(4)
    w_cpu = torch.randn(32, 16)
    xs = [torch.randn(8, 32) for _ in range(inputs)]
    grads = []
    for x in xs:
        w = w_cpu.to(device).requires_grad_()
        (grad,) = torch.autograd.grad((x.to(device) @ w).tanh().pow(2).sum(), w)
        grads.append(grad)
    return [w_cpu, *xs, *grads]


@pytest.mark.native
def test_concurrent_autograd_on_shared_weights(native_device, tmp_path):
    made = results_on_native(_one_gradient_per_input, native_device, tmp_path, inputs=THREADS)
    w_cpu, xs, expected = made[0], made[1:THREADS + 1], made[THREADS + 1:]
    w_dev = w_cpu.to("flagos").requires_grad_()
    xs_dev = [x.to("flagos") for x in xs]
    bad = []

    def work(tid):
        for it in range(ITERATIONS // 5):
            (grad,) = torch.autograd.grad((xs_dev[tid] @ w_dev).tanh().pow(2).sum(), w_dev)
            if grad.device.type != "flagos" or not torch.equal(grad.cpu(), expected[tid]):
                bad.append((tid, it))

    errors = _run_threads(work)
    assert errors == []
    assert bad == []


@pytest.mark.native
def test_per_thread_generators_are_reproducible(native_device):
    def draws(device, seed):
        g = torch.Generator(device=device)
        g.manual_seed(seed)
        return [torch.randn(64, device=device, generator=g) for _ in range(10)]

    expected = {tid: torch.stack(draws(native_device, 1000 + tid)).cpu() for tid in range(THREADS)}
    got = {}

    def work(tid):
        got[tid] = torch.stack(draws("flagos", 1000 + tid)).cpu()

    errors = _run_threads(work)
    assert errors == []
    for tid in range(THREADS):
        assert torch.equal(got[tid], expected[tid]), tid


@pytest.mark.native
def test_reseeding_a_generator_while_another_thread_draws_changes_no_draw():
    # Native kernels lock the native generator while they draw; flagos's
    # generator reseeded it (and read its state) without that lock, so a
    # draw changed midway: every draw of this loop, and CPU-only code too,
    # as torch.manual_seed seeds flagos:0, which is CPU's generator.
    g = torch.Generator("flagos")
    n = 1 << 20
    g.manual_seed(1)
    expected = torch.rand(n, device="flagos", generator=g).cpu()
    stop = threading.Event()

    def reseed():
        while not stop.is_set():
            g.manual_seed(1)
            g.get_state()

    thread = threading.Thread(target=reseed)
    thread.start()
    try:
        changed = 0
        for _ in range(20):
            g.manual_seed(1)
            changed += not torch.equal(torch.rand(n, device="flagos", generator=g).cpu(), expected)
    finally:
        stop.set()
        thread.join()
    assert changed == 0


def test_allocator_stats_balance_after_concurrent_use():
    gc.collect()
    base = torch.flagos.memory_allocated()
    base_count = torch.flagos.memory_stats()["allocation.all.current"]

    def work(tid):
        keep = []
        for it in range(ITERATIONS):
            keep.append(torch.empty((tid + 1) * 100 + it, device="flagos"))
            if len(keep) > 5:
                keep.pop(0)

    errors = _run_threads(work)
    assert errors == []
    gc.collect()
    assert torch.flagos.memory_allocated() == base
    assert torch.flagos.memory_stats()["allocation.all.current"] == base_count
    torch.flagos.empty_cache()
    assert torch.flagos.memory_reserved() >= torch.flagos.memory_allocated()
