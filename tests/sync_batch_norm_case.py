"""The SyncBatchNorm case of test_distributed.py, shared by the ranks
(distributed_ranks.py) and the test's single-process reference."""

import torch

STEPS = 2


def batch(rank, step):
    # Ranks of unequal batch sizes, as SyncBatchNorm allows.
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(3 + rank, 3, 6, 6, generator=gen)


def model_on_the_cpu():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(), torch.nn.Conv2d(4, 2, 1))
