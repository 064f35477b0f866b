"""torch.profiler and torch.autograd.profiler on flagos: the memory flagos
allocates is counted against the ops that allocate it, and the legacy
profiler's device timing (`use_device="flagos"`, what `use_cuda=True`
becomes in ported code) records the runtime's own events."""

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import flagos_core


@pytest.mark.skipif(flagos_core.runtime()["name"] != "host", reason="the host runtime's allocator reports")
def test_profile_memory_counts_flagos_allocations():
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        a = torch.ones(2**20, device="flagos")
        del a
    usage = {e.key: e.self_device_memory_usage for e in prof.key_averages()}
    assert usage["aten::empty"] == 4 * 2**20
    assert usage["[memory]"] == -4 * 2**20  # the free, outside any op


def test_the_legacy_profiler_times_flagos_ops(capfd):
    x = torch.randn(64, 64, device="flagos")
    with torch.autograd.profiler.profile(use_device="flagos") as prof:
        (x @ x).sum()
        torch.flagos.synchronize()
    table = prof.key_averages().table()
    err = capfd.readouterr().err
    assert "Exception in RecordFunction callback" not in err and "INTERNAL ASSERT" not in err, err[-2000:]
    assert "aten::mm" in table
    mm = [e for e in prof.function_events if e.name == "aten::mm"]
    assert mm and all(e.cpu_time_total > 0 and e.device_time_total >= 0 for e in mm)
    assert 0 <= prof.self_cpu_time_total < 60e6  # microseconds: a sane total, not garbage
