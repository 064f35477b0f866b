"""Memory statistics of the flagos allocator follow allocations, frees and the cache."""

import gc
import os

import pytest
import torch

import flagos_core  # noqa: F401

MB = 1 << 20


@pytest.fixture
def clean():
    """Start from an empty cache: reserved == what is live."""
    gc.collect()
    torch.flagos.synchronize()
    torch.flagos.empty_cache()
    torch.flagos.reset_peak_memory_stats()
    yield
    gc.collect()
    torch.flagos.empty_cache()


def _stats():
    return torch.flagos.memory_allocated(), torch.flagos.memory_reserved()


def test_empty_cache_releases_every_cached_block(clean):
    keep = torch.empty(3000, device="flagos")
    for n in (100, 5000, 70000, MB):
        torch.empty(n, device="flagos")  # freed at once: cached
    allocated, reserved = _stats()
    assert reserved - allocated >= 4 * (100 + 5000 + 70000 + MB)
    torch.flagos.empty_cache()
    if flagos_core.runtime()["name"] == "host":
        assert _stats() == (allocated, allocated), "only live blocks stay reserved"
    else:  # a native pool keeps the whole segment a live block is in
        assert _stats()[0] == allocated
        assert _stats()[1] <= reserved - 4 * MB, "the cached megabyte blocks were not released"
    del keep


def test_convolution_results_count_and_are_given_back(clean):
    # Convolutions run outside the router (convolution_overrideable): their
    # results and gradients come from the flagos allocator too, as every other
    # op's do, so they count while alive and are given back when freed.
    x = torch.randn(1, 8, 64, 64, device="flagos", requires_grad=True)
    w = torch.randn(16, 8, 3, 3, device="flagos", requires_grad=True)
    before = torch.flagos.memory_allocated()
    y = torch.nn.functional.conv2d(x, w, padding=1)
    assert torch.flagos.memory_allocated() - before >= y.nbytes
    y.sum().backward()
    del y
    assert torch.flagos.memory_allocated() - before >= x.grad.nbytes + w.grad.nbytes
    grads = x.grad.nbytes + w.grad.nbytes
    x.grad = w.grad = None
    assert torch.flagos.memory_allocated() == before, f"{grads} bytes of gradients were not given back"


def test_allocate_free_cache_and_release(clean):
    alloc0, res0 = _stats()

    x = torch.empty(MB, dtype=torch.uint8, device="flagos")
    alloc1, res1 = _stats()
    assert alloc1 - alloc0 >= MB
    assert res1 - res0 >= MB
    assert res1 >= alloc1
    assert torch.flagos.max_memory_allocated() >= alloc1

    del x
    alloc2, res2 = _stats()
    assert alloc2 == alloc0, "freeing the tensor must give its bytes back"
    assert res2 == res1, "a freed block stays cached (reserved)"

    # The cached block is reused: a second tensor of the same size reserves nothing new.
    y = torch.empty(MB, dtype=torch.uint8, device="flagos")
    assert _stats() == (alloc1, res1)
    del y

    torch.flagos.empty_cache()
    alloc3, res3 = _stats()
    assert alloc3 == alloc0
    assert res3 == res0, "empty_cache releases the cached block"


def test_empty_cache_keeps_live_blocks(clean):
    x = torch.empty(MB // 4, device="flagos")  # 1 MB of float32
    alloc1, res1 = _stats()
    torch.flagos.empty_cache()
    assert _stats() == (alloc1, res1)
    assert torch.equal(x.fill_(3.0).cpu(), torch.full((MB // 4,), 3.0))


def test_peak_and_reset(clean):
    base = torch.flagos.memory_allocated()
    assert torch.flagos.max_memory_allocated() == base  # reset by the fixture

    keep = torch.empty(MB, dtype=torch.uint8, device="flagos")
    tmp = torch.empty(2 * MB, dtype=torch.uint8, device="flagos")
    peak = torch.flagos.max_memory_allocated()
    assert peak >= base + 3 * MB
    del tmp
    current = torch.flagos.memory_allocated()
    assert current < peak
    assert torch.flagos.max_memory_allocated() == peak, "the peak survives the free"
    assert torch.flagos.max_memory_reserved() >= peak

    torch.flagos.reset_peak_memory_stats()
    assert torch.flagos.max_memory_allocated() == current
    assert torch.flagos.max_memory_reserved() == torch.flagos.memory_reserved()
    del keep


def test_memory_stats_keys_and_consistency(clean):
    x = torch.empty(1000, device="flagos")  # 4000 bytes requested
    stats = torch.flagos.memory_stats()
    for key in (
        "allocated_bytes.all.current", "allocated_bytes.all.peak",
        "allocated_bytes.all.allocated", "allocated_bytes.all.freed",
        "reserved_bytes.all.current", "reserved_bytes.all.peak",
        "active_bytes.all.current", "requested_bytes.all.current",
        "allocation.all.current", "segment.all.current",
        "num_ooms", "num_alloc_retries",
    ):
        assert key in stats, key
        assert isinstance(stats[key], int)
    assert stats["allocated_bytes.all.current"] == torch.flagos.memory_allocated()
    assert stats["allocated_bytes.all.peak"] == torch.flagos.max_memory_allocated()
    assert stats["reserved_bytes.all.current"] == torch.flagos.memory_reserved()
    assert (stats["allocated_bytes.all.allocated"] - stats["allocated_bytes.all.freed"]
            == stats["allocated_bytes.all.current"])
    assert stats["num_ooms"] == 0

    # torch.cuda.memory_stats()'s keys, every one: the pools add up to "all".
    for name in ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes",
                 "active_bytes", "inactive_split_bytes", "requested_bytes"):
        for figure in ("current", "peak", "allocated", "freed"):
            small, large = stats[f"{name}.small_pool.{figure}"], stats[f"{name}.large_pool.{figure}"]
            if figure != "peak":  # the pools peak at different times
                assert stats[f"{name}.all.{figure}"] == small + large, f"{name}.{figure}"
    for key in ("oversize_allocations.current", "oversize_segments.peak", "num_sync_all_streams",
                "num_device_alloc", "num_device_free", "max_split_size"):
        assert isinstance(stats[key], int), key
    assert len(stats) == 122

    before = stats
    y = torch.empty(1000, device="flagos")
    after = torch.flagos.memory_stats()
    assert after["requested_bytes.all.current"] - before["requested_bytes.all.current"] == 4000
    assert after["allocated_bytes.all.current"] - before["allocated_bytes.all.current"] >= 4000
    assert after["allocation.all.current"] - before["allocation.all.current"] == 1
    del x, y
    assert torch.flagos.memory_stats()["allocation.all.current"] == before["allocation.all.current"] - 1


def test_device_argument_forms(clean):
    x = torch.empty(MB, dtype=torch.uint8, device="flagos")
    expected = torch.flagos.memory_allocated()
    assert expected >= MB
    for dev in (None, 0, "flagos", "flagos:0", torch.device("flagos"), torch.device("flagos", 0)):
        assert torch.flagos.memory_allocated(dev) == expected, dev
    with pytest.raises(ValueError):
        torch.flagos.memory_allocated("cpu")
    del x


@pytest.mark.skipif(flagos_core.runtime()["name"] != "host", reason="the host allocator's check")
def test_torch_accelerator_names_an_invalid_device_as_torch_flagos_does():
    # torch.accelerator's memory calls reach the allocator directly; it said
    # "no host device 5" where every other call names the valid devices.
    bad = torch.flagos.device_count()
    for call in (torch.accelerator.memory_allocated, torch.accelerator.memory_stats,
                 torch.accelerator.reset_peak_memory_stats, torch.flagos.memory_allocated):
        with pytest.raises(RuntimeError, match=f"flagos:{bad} is not a valid device: the host runtime has"):
            call(bad)


def _delta(fn):
    before = torch.flagos.memory_allocated()
    out = fn()
    return out, torch.flagos.memory_allocated() - before


def test_op_outputs_are_counted(clean, native_device):
    torch.manual_seed(0)
    a_cpu, b_cpu = torch.randn(256, 256), torch.randn(256, 256)
    a, b = a_cpu.to("flagos"), b_cpu.to("flagos")
    nbytes = a.nbytes  # 256 KiB

    c, grew = _delta(lambda: a + b)
    assert grew >= nbytes
    assert torch.equal(c.cpu(), a_cpu + b_cpu)

    d, grew = _delta(lambda: a @ b)
    assert grew >= nbytes
    assert torch.equal(d.cpu(), (a_cpu.to(native_device) @ b_cpu.to(native_device)).cpu())

    (values, indices), grew = _delta(lambda: a.sort(dim=1))
    assert grew >= values.nbytes + indices.nbytes

    nz, grew = _delta(lambda: (a > 0).nonzero())
    assert grew >= nz.nbytes

    r, grew = _delta(lambda: torch.randn(256, 256, device="flagos"))
    assert grew >= nbytes

    # Metadata-only views and in-place ops allocate nothing.
    _, grew = _delta(lambda: (a.view(-1), a.t(), a[3:7, ::2], a.unsqueeze(0)))
    assert grew == 0
    _, grew = _delta(lambda: c.add_(1).mul_(2))
    assert grew == 0

    live = torch.flagos.memory_allocated()
    del c, d, values, indices, nz, r
    assert torch.flagos.memory_allocated() <= live - 5 * nbytes


def test_autograd_buffers_are_counted_and_freed(clean):
    w = torch.randn(512, 512).to("flagos").requires_grad_()
    # A native library's workspaces (cuBLAS's, one per stream and thread, the
    # backward's thread included), made on first use and kept, are not this test's.
    (w @ w).sum().backward()
    w.grad = None
    base = torch.flagos.memory_allocated()
    loss = (w @ w).sum()
    loss.backward()
    assert w.grad is not None
    assert torch.flagos.memory_allocated() - base >= w.nbytes  # the gradient
    del loss
    w.grad = None
    assert torch.flagos.memory_allocated() == base


def test_resize_changes_allocation(clean):
    x = torch.empty(10, device="flagos")
    before = torch.flagos.memory_allocated()
    x.resize_(MB // 4)  # the 40-byte block is replaced by a 1 MB one
    assert x.untyped_storage().nbytes() == MB
    assert torch.flagos.memory_allocated() - before >= MB - 512
    x.fill_(1.0)
    assert x.sum().item() == MB // 4


_ACCEL_MEMORY = hasattr(torch, "accelerator") and hasattr(torch.accelerator, "memory_allocated")


@pytest.mark.skipif(not _ACCEL_MEMORY, reason="this torch has no torch.accelerator memory functions")
def test_torch_accelerator_memory_agrees(clean):
    x = torch.empty(MB, dtype=torch.uint8, device="flagos")
    y = torch.empty(2 * MB, dtype=torch.uint8, device="flagos")
    del y
    acc = torch.accelerator
    assert acc.memory_allocated() == torch.flagos.memory_allocated() >= MB
    assert acc.memory_allocated(0) == torch.flagos.memory_allocated(0)
    assert acc.memory_reserved() == torch.flagos.memory_reserved() >= 3 * MB
    assert acc.max_memory_allocated() == torch.flagos.max_memory_allocated() >= 3 * MB
    assert acc.max_memory_reserved() == torch.flagos.max_memory_reserved()

    ours = torch.flagos.memory_stats()
    theirs = acc.memory_stats()
    for key, value in ours.items():
        assert theirs.get(key) == value, key

    acc.reset_peak_memory_stats()
    assert torch.flagos.max_memory_allocated() == torch.flagos.memory_allocated()
    reserved = torch.flagos.memory_reserved()
    acc.empty_cache()
    assert torch.flagos.memory_reserved() < reserved, "the cached 2 MB block was not released"
    left = torch.flagos.memory_reserved()
    torch.flagos.empty_cache()
    assert torch.flagos.memory_reserved() == left, "torch.accelerator.empty_cache left cached blocks behind"
    del x


def test_mem_get_info_reports_host_ram_on_the_host_runtime():
    if flagos_core.runtime()["name"] != "host":
        pytest.skip("host runtime figures")
    free, total = torch.flagos.mem_get_info()
    page = os.sysconf("SC_PAGE_SIZE")
    assert total == page * os.sysconf("SC_PHYS_PAGES")
    assert 0 < free <= total
    if hasattr(torch.accelerator, "get_memory_info"):
        assert torch.accelerator.get_memory_info(0)[1] == total


@pytest.mark.skipif(flagos_core.runtime()["name"] != "host", reason="the host runtime's CPU-allocator redirect")
def test_raw_allocations_inside_host_kernels(clean):
    """oneDNN takes its scratch memory through the CPU allocator's raw_allocate
    (bf16 Linear on 3-d input goes that way); inside a host kernel that memory
    comes from the flagos pool and must go back to it."""
    torch.manual_seed(0)
    ref = torch.nn.Linear(64, 128).to(torch.bfloat16)
    dev = torch.nn.Linear(64, 128).to(torch.bfloat16)
    dev.load_state_dict(ref.state_dict())
    dev = dev.to("flagos")
    x = torch.randn(2, 16, 64, dtype=torch.bfloat16)
    before = torch.flagos.memory_allocated()
    out_ref, out = ref(x), dev(x.to("flagos"))
    out_ref.float().square().sum().backward()
    out.float().square().sum().backward()
    assert torch.equal(out.cpu(), out_ref)
    assert torch.equal(dev.weight.grad.cpu(), ref.weight.grad)
    del out
    dev.zero_grad(set_to_none=True)
    gc.collect()
    assert torch.flagos.memory_allocated() == before


@pytest.mark.skipif(not hasattr(torch.accelerator, "empty_host_cache"), reason="this torch has no empty_host_cache")
def test_empty_host_cache_with_pinned_memory_in_use(clean):
    # torch asks the device type's host allocator, once the device is in use
    # (mem_get_info makes sure it is): flagos registers one, so this neither
    # crashes nor frees pinned memory still held.
    torch.flagos.mem_get_info()
    host = torch.arange(4096, dtype=torch.float32).pin_memory()
    assert host.is_pinned()
    on_device = host.to("flagos", non_blocking=True)
    torch.accelerator.empty_host_cache()
    torch.flagos.synchronize()
    assert torch.equal(on_device.cpu(), torch.arange(4096, dtype=torch.float32))
    assert torch.equal(host, torch.arange(4096, dtype=torch.float32))


@pytest.mark.skipif(flagos_core.runtime()["name"] != "host",
                    reason="the core's own table; the CUDA plugin gives torch.cuda's (tests/test_cuda_plugin.py)")
def test_memory_summary_tabulates_memory_stats(clean):
    x = torch.empty(3 * MB, dtype=torch.uint8, device="flagos")
    summary = torch.flagos.memory_summary()
    stats = torch.flagos.memory_stats()
    assert summary == torch.flagos.memory_summary(0) == torch.flagos.memory_summary("flagos:0")
    rows = {line[:28].strip(): line[28:].split() for line in summary.splitlines()[3:-2]}
    assert rows["allocated memory"][:2] == [f"{stats['allocated_bytes.all.current'] / MB:.2f}", "MiB"]
    assert rows["allocations"] == [str(stats[f"allocation.all.{c}"]) for c in ("current", "peak", "allocated", "freed")]
    assert "flagos:0" in summary.splitlines()[1]
    with pytest.raises(RuntimeError, match="is not a valid device"):
        torch.flagos.memory_summary(torch.flagos.device_count())
    del x


@pytest.mark.skipif(flagos_core.runtime()["name"] != "host", reason="the host runtime's allocator")
def test_out_of_memory_is_torch_out_of_memory_error_after_releasing_the_cache(clean):
    # As CUDA's allocator: cached blocks go back to the system and the
    # allocation is tried once more before it fails, as torch.OutOfMemoryError
    # (what batch-size finders catch), counted in num_ooms.
    cached = torch.empty(4 * MB, dtype=torch.uint8, device="flagos")
    del cached
    before = torch.flagos.memory_stats()
    assert before["reserved_bytes.all.current"] >= 4 * MB
    with pytest.raises(torch.flagos.OutOfMemoryError, match="flagos:0 .*out of memory"):
        torch.empty(1 << 50, dtype=torch.uint8, device="flagos")  # beyond any address space
    after = torch.flagos.memory_stats()
    assert after["num_ooms"] == before["num_ooms"] + 1
    assert after["num_alloc_retries"] == before["num_alloc_retries"] + 1
    assert after["reserved_bytes.all.current"] == after["allocated_bytes.all.current"]
    assert torch.flagos.OutOfMemoryError is torch.OutOfMemoryError
    assert torch.equal(torch.ones(3, device="flagos").cpu(), torch.ones(3))
