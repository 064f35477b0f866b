"""One rank of a torch.distributed group for test_distributed.py: every
collective, DistributedDataParallel and FSDP2 training, on one side: flagos
tensors, or the native device's in a process without flagos (a native
accelerator's backward cannot run beside flagos, pytorch/pytorch#161129).
Prints `ok NAME` per check and saves each check's results (on the CPU) to
RESULTS; the test compares the two sides bitwise.

    python tests/distributed_ranks.py RANK WORLD_SIZE INIT_FILE BACKEND|default SIDE RESULTS [sync_batch_norm]

SIDE: flagos, or the native device's type (cpu, cuda) for the reference.
With `sync_batch_norm`, the rank trains a model with SyncBatchNorm under DDP
instead (tests/sync_batch_norm_case.py), and saves its parameters and running
statistics after each step.
"""

import faulthandler
import os
import sys

SIDE = sys.argv[5]
if SIDE != "flagos":
    os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"  # before torch: no flagos in this process

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # noqa: E402

if SIDE == "flagos":
    import flagos_core  # noqa: E402,F401  (autoload may be off)

faulthandler.enable()  # a crash in a collective shows where
DEVICE = torch.device(SIDE)
RESULTS = {}


def record(name, result):
    result = result if isinstance(result, (list, tuple)) else [result]
    for t in result:
        if t.device.type != DEVICE.type:
            sys.exit(f"{name}: a result on {t.device}, not on {DEVICE}")
    RESULTS[name] = [t.detach().cpu() for t in result]
    print("ok", name, flush=True)


def collectives(rank, world):
    gen = torch.Generator().manual_seed(100 + rank)
    data = torch.randn(1000, generator=gen)  # sums whose order shows
    # Each check copies `data` (on the CPU, .to(device) would alias it and an
    # in-place collective would change it for the checks after).

    def all_reduce(device, op=dist.ReduceOp.SUM, dtype=torch.float32):
        t = (data * 1000).to(dtype).to(device, copy=True)
        dist.all_reduce(t, op=op)
        return t

    record("all_reduce", all_reduce(DEVICE))
    record("all_reduce_max_int64", all_reduce(DEVICE, dist.ReduceOp.MAX, torch.int64))

    def broadcast(device):
        t = data.to(device, copy=True)
        dist.broadcast(t, src=world - 1)
        return t

    record("broadcast", broadcast(DEVICE))

    def all_gather(device):
        out = [torch.empty(7, device=device) for _ in range(world)]
        dist.all_gather(out, data[:7].to(device, copy=True))
        return out

    record("all_gather", all_gather(DEVICE))

    def all_gather_into_tensor(device):
        out = torch.empty(7 * world, device=device)
        dist.all_gather_into_tensor(out, data[:7].to(device, copy=True))
        return out

    record("all_gather_into_tensor", all_gather_into_tensor(DEVICE))

    def reduce_scatter_tensor(device):
        out = torch.empty(5, device=device)
        dist.reduce_scatter_tensor(out, data[: 5 * world].to(device, copy=True))
        return out

    record("reduce_scatter_tensor", reduce_scatter_tensor(DEVICE))

    def reduce(device):
        t = data.to(device, copy=True)
        dist.reduce(t, dst=0)
        return t

    record("reduce", reduce(DEVICE))

    def gather_scatter(device):
        gathered = [torch.empty(3, device=device) for _ in range(world)] if rank == 0 else None
        dist.gather(data[:3].to(device, copy=True), gathered, dst=0)
        part = torch.empty(3, device=device)
        dist.scatter(part, [data[i : i + 3].to(device, copy=True) for i in range(world)] if rank == 0 else None, src=0)
        return (gathered or []) + [part]

    record("gather_scatter", gather_scatter(DEVICE))

    def all_to_all_single(device):
        out = torch.empty(2 * world, device=device)
        dist.all_to_all_single(out, data[: 2 * world].to(device, copy=True))
        return out

    record("all_to_all_single", all_to_all_single(DEVICE))

    if world > 1:

        def send_recv(device):
            t = data[:4].to(device, copy=True) if rank == 0 else torch.empty(4, device=device)
            if rank == 0:
                dist.send(t, dst=1)
            elif rank == 1:
                dist.recv(t, src=0)
            return t

        record("send_recv", send_recv(DEVICE))

    def asynchronous(device):
        t = data.to(device, copy=True)
        work = dist.all_reduce(t, async_op=True)
        doubled = work.get_future().then(lambda fut: [fut.value()[0] * 2])
        work.wait()
        return [t, doubled.wait()[0]]

    record("async_work_and_future", asynchronous(DEVICE))

    def functional(device):  # the ops DTensor and FSDP2 call
        ops = torch.ops._c10d_functional
        name = dist.group.WORLD.group_name
        return [
            ops.wait_tensor(ops.all_reduce(data.to(device, copy=True), "sum", name)),
            ops.wait_tensor(ops.all_gather_into_tensor(data[:5].to(device, copy=True), world, name)),
        ]

    record("functional_collectives", functional(DEVICE))

    def into_a_view(device):
        t = torch.zeros(4, 6, device=device)
        column = t[:, 2:3].contiguous()
        column.copy_(data[:4].view(4, 1))
        dist.all_reduce(column)
        t[:, 2:3] = column
        return t

    record("all_reduce_then_copy_into_a_view", into_a_view(DEVICE))
    dist.barrier()
    print("ok barrier", flush=True)


def ddp_training(device, rank, hook):
    torch.manual_seed(0)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.001)  # several buckets
    if hook is not None:
        ddp.register_comm_hook(None, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(7 + rank)  # each rank its own batch
    for _ in range(3):
        x = torch.randn(8, 16, generator=gen).to(device)
        opt.zero_grad()
        ddp(x).square().mean().backward()
        opt.step()
    return [p.detach() for p in model.parameters()] + [p.grad for p in model.parameters()]


def fsdp2_training(device, rank, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    # Built on the CPU: fully_shard moves the parameters (`param.data = ...`).
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    mesh = init_device_mesh(device.type, (world,))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(7 + rank)
    for _ in range(3):
        x = torch.randn(8, 16, generator=gen).to(device)
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    return [p.full_tensor().detach() for p in model.parameters()]


def sync_batch_norm_training(device, rank):
    from sync_batch_norm_case import STEPS, batch, model_on_the_cpu

    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model_on_the_cpu()).to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(STEPS):
        opt.zero_grad()
        ddp(batch(rank, step).to(device)).square().mean().backward()
        opt.step()
        record(f"sync_batch_norm_step_{step}", [t.detach() for t in model.state_dict().values()])


def main():
    rank, world, init_file, backend, _, results_file = sys.argv[1:7]
    rank, world = int(rank), int(world)
    if sys.argv[7:] == ["sync_batch_norm"]:
        dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world)
        sync_batch_norm_training(DEVICE, rank)
    elif backend == "default":
        # Chosen by torch.distributed for the accelerator (flagos) alone.
        dist.init_process_group(init_method=f"file://{init_file}", rank=rank, world_size=world)
        t = torch.full((3,), float(rank + 1), device="flagos")
        dist.all_reduce(t)
        if not torch.equal(t.cpu(), torch.full((3,), float(world * (world + 1) // 2))):
            sys.exit(f"default_backend_all_reduce: {t.cpu()}")
        record("default_backend_all_reduce", t)
        dist.barrier()
        print("ok default_backend_barrier", flush=True)
    else:
        dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world)
        collectives(rank, world)
        record("ddp", ddp_training(DEVICE, rank, None))
        record("ddp_allreduce_hook", ddp_training(DEVICE, rank, default_hooks.allreduce_hook))
        record("fsdp2", fsdp2_training(DEVICE, rank, world))
    dist.destroy_process_group()
    torch.save(RESULTS, results_file)
    if SIDE == "cpu":
        # The reference ranks are plain torch: once, under load, a CPU rank
        # aborted in the interpreter's teardown after saving its results
        # ("terminate called without an active exception", no flagos frame).
        # Their results are saved; their teardown is not under test.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
