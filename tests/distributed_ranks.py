"""One rank of a torch.distributed group for test_distributed.py: every
collective, DistributedDataParallel and FSDP2 training on flagos tensors and
on the native device's, compared bitwise. Prints `ok NAME` per check, and
exits non-zero at the first mismatch.

    python tests/distributed_ranks.py RANK WORLD_SIZE INIT_FILE BACKEND|default
"""

import sys

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

import flagos_core

NATIVE = torch.device("cpu" if flagos_core.runtime()["name"] == "host" else flagos_core.runtime()["name"])


def same(name, flagos_result, native_result):
    flagos_result = flagos_result if isinstance(flagos_result, (list, tuple)) else [flagos_result]
    native_result = native_result if isinstance(native_result, (list, tuple)) else [native_result]
    for f, n in zip(flagos_result, native_result, strict=True):
        if f.device.type != "flagos":
            sys.exit(f"{name}: a result on {f.device}, not on flagos")
        if not torch.equal(f.cpu(), n.cpu()):
            sys.exit(f"{name}: flagos {f.cpu()} != native {n.cpu()}")
    print("ok", name, flush=True)


def on_both(make):
    """make(device) -> result, run on flagos and then on the native device."""
    return make(torch.device("flagos")), make(NATIVE)


def collectives(rank, world):
    gen = torch.Generator().manual_seed(100 + rank)
    data = torch.randn(1000, generator=gen)  # sums whose order shows

    def all_reduce(device, op=dist.ReduceOp.SUM, dtype=torch.float32):
        t = (data * 1000).to(dtype).to(device)
        dist.all_reduce(t, op=op)
        return t

    same("all_reduce", *on_both(all_reduce))
    same("all_reduce_max_int64", *on_both(lambda d: all_reduce(d, dist.ReduceOp.MAX, torch.int64)))

    def broadcast(device):
        t = data.to(device)
        dist.broadcast(t, src=world - 1)
        return t

    same("broadcast", *on_both(broadcast))

    def all_gather(device):
        out = [torch.empty(7, device=device) for _ in range(world)]
        dist.all_gather(out, data[:7].to(device))
        return out

    same("all_gather", *on_both(all_gather))

    def all_gather_into_tensor(device):
        out = torch.empty(7 * world, device=device)
        dist.all_gather_into_tensor(out, data[:7].to(device))
        return out

    same("all_gather_into_tensor", *on_both(all_gather_into_tensor))

    def reduce_scatter_tensor(device):
        out = torch.empty(5, device=device)
        dist.reduce_scatter_tensor(out, data[: 5 * world].to(device))
        return out

    same("reduce_scatter_tensor", *on_both(reduce_scatter_tensor))

    def reduce(device):
        t = data.to(device)
        dist.reduce(t, dst=0)
        return t

    same("reduce", *on_both(reduce))

    def gather_scatter(device):
        gathered = [torch.empty(3, device=device) for _ in range(world)] if rank == 0 else None
        dist.gather(data[:3].to(device), gathered, dst=0)
        part = torch.empty(3, device=device)
        dist.scatter(part, [data[i : i + 3].to(device) for i in range(world)] if rank == 0 else None, src=0)
        return (gathered or []) + [part]

    same("gather_scatter", *on_both(gather_scatter))

    def all_to_all_single(device):
        out = torch.empty(2 * world, device=device)
        dist.all_to_all_single(out, data[: 2 * world].to(device))
        return out

    same("all_to_all_single", *on_both(all_to_all_single))

    if world > 1:

        def send_recv(device):
            t = data[:4].to(device) if rank == 0 else torch.empty(4, device=device)
            if rank == 0:
                dist.send(t, dst=1)
            elif rank == 1:
                dist.recv(t, src=0)
            return t

        same("send_recv", *on_both(send_recv))

    def asynchronous(device):
        t = data.to(device)
        work = dist.all_reduce(t, async_op=True)
        doubled = work.get_future().then(lambda fut: [fut.value()[0] * 2])
        work.wait()
        return [t, doubled.wait()[0]]

    same("async_work_and_future", *on_both(asynchronous))

    def functional(device):  # the ops DTensor and FSDP2 call
        ops = torch.ops._c10d_functional
        name = dist.group.WORLD.group_name
        return [
            ops.wait_tensor(ops.all_reduce(data.to(device), "sum", name)),
            ops.wait_tensor(ops.all_gather_into_tensor(data[:5].to(device), world, name)),
        ]

    same("functional_collectives", *on_both(functional))

    def into_a_view(device):
        t = torch.zeros(4, 6, device=device)
        column = t[:, 2:3].contiguous()
        column.copy_(data[:4].view(4, 1))
        dist.all_reduce(column)
        t[:, 2:3] = column
        return t

    same("all_reduce_then_copy_into_a_view", *on_both(into_a_view))
    dist.barrier()
    print("ok barrier", flush=True)


def ddp_training(rank, hook):
    def train(device):
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

    return on_both(train)


def fsdp2_training(rank, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    def train(device):
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

    return on_both(train)


def main():
    rank, world, init_file, backend = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    if backend == "default":
        # Chosen by torch.distributed for the accelerator (flagos) alone.
        dist.init_process_group(init_method=f"file://{init_file}", rank=rank, world_size=world)
        t = torch.full((3,), float(rank + 1), device="flagos")
        dist.all_reduce(t)
        same("default_backend_all_reduce", t, torch.full((3,), float(world * (world + 1) // 2)))
        dist.barrier()
        print("ok default_backend_barrier", flush=True)
    else:
        dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world)
        collectives(rank, world)
        same("ddp", *ddp_training(rank, None))
        same("ddp_allreduce_hook", *ddp_training(rank, default_hooks.allreduce_hook))
        same("fsdp2", *fsdp2_training(rank, world))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
