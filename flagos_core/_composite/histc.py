"""`histc` with CUDA's integer kernels, which CPU's lacks."""

import torch


def histc(self, bins=100, min=0, max=0):
    # transformers' MoE layers count the tokens per expert with an integer
    # histc on every device but cpu and mps. Floats go to the runtime's own
    # histc.out, CPU's kernel, as a native call of histc would; integers are
    # counted as CUDA's kernel counts them.
    if self.is_floating_point() or self.is_complex() or self.dtype == torch.bool:
        return torch.histc(self, bins, min, max, out=self.new_empty(0))
    return _integer_histc(self, bins, min, max)


def _integer_histc(self, bins, low, high):
    # As CUDA: the bounds in the input's integer type; where they are equal,
    # the data's own extremes, widened by one each way if those are equal too;
    # bin = (value - low) * bins // (high - low), the top edge in the last bin,
    # values outside [low, high] left out; the counts in the input's dtype.
    torch._check(bins > 0, lambda: f"histc: bins must be > 0, got {bins}")
    low, high = int(low), int(high)
    if low == high and self.numel() > 0:
        low, high = int(self.min()), int(self.max())
    if low == high:
        low, high = low - 1, high + 1
    torch._check(low < high, lambda: f"histc: max must be larger than min, got min {low} and max {high}")
    values = self.reshape(-1).long()
    inside = (values >= low) & (values <= high)
    index = ((values - low) * bins).div(high - low, rounding_mode="floor").clamp(0, bins - 1)
    counts = torch.zeros(bins, dtype=torch.long, device=self.device).scatter_add_(0, index, inside.long())
    return counts.to(self.dtype)
