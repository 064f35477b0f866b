"""CUDA graphs of flagos work: flagos kernels are CUDA kernels on the current
CUDA stream, so torch.cuda's capture machinery records them as they are."""

import torch

CUDAGraph = torch.cuda.CUDAGraph
graph_pool_handle = torch.cuda.graph_pool_handle


class graph(torch.cuda.graph):
    """`with torch.flagos.graph(g):` captures the flagos work in the block."""
