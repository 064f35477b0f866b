"""torch.distributed on flagos tensors: every collective, DDP and FSDP2 training
through the native device's backend, bitwise equal to the native device's
results (tests/distributed_ranks.py runs each rank)."""

import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import flagos_core

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="this torch has no torch.distributed")

RANKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "distributed_ranks.py")
COLLECTIVES = [
    "all_reduce", "all_reduce_max_int64", "broadcast", "all_gather", "all_gather_into_tensor",
    "reduce_scatter_tensor", "reduce", "gather_scatter", "all_to_all_single", "async_work_and_future",
    "functional_collectives", "all_reduce_then_copy_into_a_view", "barrier", "ddp", "ddp_allreduce_hook", "fsdp2",
]


def run_ranks(tmp_path, world, backend, side="flagos", checks=()):
    """Runs the ranks of one side; returns each rank's checks and results."""
    init_file = tmp_path / f"init-{side}"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    results = [tmp_path / f"{side}-{rank}.pt" for rank in range(world)]
    procs = [
        subprocess.Popen(
            [sys.executable, RANKS, str(rank), str(world), str(init_file), backend, side, str(results[rank]), *checks],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        for rank in range(world)
    ]
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"a {side} rank failed:\n{out}\n{err[-3000:]}"
        outputs.append([line.split()[1] for line in out.splitlines() if line.startswith("ok ")])
    return outputs, [torch.load(path) for path in results]


def flagos_against_native(tmp_path, world):
    """The checks on flagos and on the native device (a process without
    flagos), each check's results bitwise equal on every rank."""
    outputs, flagos = run_ranks(tmp_path, world, native_backend())
    native_outputs, native = run_ranks(tmp_path, world, native_backend(), flagos_core._C._native_device_type())
    assert native_outputs == outputs
    for rank in range(world):
        assert flagos[rank].keys() == native[rank].keys()
        for name, tensors in flagos[rank].items():
            assert len(tensors) == len(native[rank][name]), name
            for f, n in zip(tensors, native[rank][name]):
                assert torch.equal(f, n), f"rank {rank}, {name}: flagos {f} != native {n}"
    return outputs


def native_backend():
    return dist.Backend.default_device_backend_map[flagos_core._C._native_device_type()]


def test_flagos_takes_the_native_devices_backend():
    assert dist.Backend.default_device_backend_map["flagos"] == native_backend()
    assert "flagos" in dist.Backend.backend_capability[native_backend()]


@pytest.mark.skipif(flagos_core.runtime()["name"] != "host", reason="two ranks on one GPU: NCCL needs a GPU each")
def test_two_ranks_collectives_and_ddp_equal_the_native_device(tmp_path):
    outputs = flagos_against_native(tmp_path, 2)
    after = COLLECTIVES.index("all_to_all_single") + 1  # then send_recv, with two ranks
    assert outputs == [COLLECTIVES[:after] + ["send_recv"] + COLLECTIVES[after:]] * 2


@pytest.mark.skipif(flagos_core.runtime()["name"] != "host", reason="two ranks on one GPU: NCCL needs a GPU each")
def test_default_backend_for_the_flagos_accelerator(tmp_path):
    outputs, _ = run_ranks(tmp_path, 2, "default")
    assert outputs == [["default_backend_all_reduce", "default_backend_barrier"]] * 2


@pytest.mark.native
def test_one_rank_collectives_and_ddp_equal_the_native_device(tmp_path):
    assert flagos_against_native(tmp_path, 1) == [COLLECTIVES]


@pytest.mark.skipif(flagos_core.runtime()["name"] != "host", reason="two ranks on one GPU: NCCL needs a GPU each")
def test_sync_batch_norm_on_two_ranks_equals_batch_norm_over_their_whole_batch(tmp_path):
    # SyncBatchNorm runs only on accelerators (CUDA's statistics kernels;
    # on the host runtime, the composite provider's). The reference is one
    # CPU model with BatchNorm2d over both ranks' batches, its loss the mean
    # of the ranks' losses, as DDP averages their gradients.
    import sync_batch_norm_case as case

    world = 2
    outputs, results = run_ranks(tmp_path, world, "gloo", checks=["sync_batch_norm"])
    steps = [f"sync_batch_norm_step_{step}" for step in range(case.STEPS)]
    assert outputs == [steps] * world

    model = case.model_on_the_cpu()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step, name in enumerate(steps):
        batches = [case.batch(rank, step) for rank in range(world)]
        opt.zero_grad()
        out = model(torch.cat(batches)).split([len(b) for b in batches])
        (sum(o.square().mean() for o in out) / world).backward()
        opt.step()
        expected = list(model.state_dict().values())
        for rank in range(world):
            for key, want, got in zip(model.state_dict(), expected, results[rank][name]):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=lambda m: f"rank {rank}, {name}, {key}: {m}")
