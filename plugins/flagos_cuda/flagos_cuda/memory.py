"""torch.flagos memory functions that only CUDA's caching allocator has.

flagos's memory on this plugin is that allocator's pool (the plugin's
allocator is CUDA's, relabelled), so these are torch.cuda's for the same GPU:
flagos:i is cuda:i."""

import torch


def install(module):
    index = module._index  # flagos device (None, int, str, torch.device) -> checked index

    def memory_summary(device=None, abbreviated=False):
        return torch.cuda.memory_summary(index(device), abbreviated)

    def memory_snapshot():
        return torch.cuda.memory_snapshot()

    def set_per_process_memory_fraction(fraction, device=None):
        torch.cuda.set_per_process_memory_fraction(fraction, index(device))

    module.memory_summary = memory_summary
    module.memory_snapshot = memory_snapshot
    module.ipc_collect = torch.cuda.ipc_collect
    module.host_memory_stats = torch.cuda.host_memory_stats
    module.set_per_process_memory_fraction = set_per_process_memory_fraction
    if hasattr(torch.cuda, "get_per_process_memory_fraction"):
        module.get_per_process_memory_fraction = lambda device=None: torch.cuda.get_per_process_memory_fraction(
            index(device))
