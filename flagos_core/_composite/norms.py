"""Normalization kernels only CUDA (and XPU) has: rms_norm's fused backward
and SyncBatchNorm's statistics."""

import torch


def fused_rms_norm_backward(grad_out, input, normalized_shape, rstd, weight, output_mask):
    # -> (grad of the input, grad of the weight), each only where output_mask asks.
    # rstd keeps the normalized dimensions, as 1s: it broadcasts over them.
    normalized = tuple(range(input.dim() - len(normalized_shape), input.dim()))
    grad = grad_out if weight is None else grad_out * weight
    grad_input = grad_weight = None
    if output_mask[0]:
        projection = (grad * input).mean(normalized, keepdim=True)
        grad_input = (rstd * (grad - input * rstd * rstd * projection)).to(input.dtype)
    if output_mask[1] and weight is not None:
        leading = tuple(range(input.dim() - len(normalized_shape)))
        grad_weight = grad_out * input * rstd
        grad_weight = (grad_weight.sum(leading) if leading else grad_weight).to(weight.dtype)
    return grad_input, grad_weight


# SyncBatchNorm (torch/nn/modules/_functions.py) calls the five kernels
# below for a PrivateUse1 tensor, as for a CUDA one. Statistics are kept in
# the accumulation dtype, float for half and bfloat16 inputs, as CUDA keeps
# them; channels are dimension 1.


def _accumulation_dtype(dtype):
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _per_channel(t, input):
    # A channel's value, broadcast over the other dimensions of `input`.
    return t.view([1, -1] + [1] * (input.dim() - 2))


def _reduced_dims(input):
    return [0] + list(range(2, input.dim()))


def _inverse_std(var, eps):
    # 1 / sqrt(var + eps), 0 where both are 0, as CUDA's InvStd.
    invstd = (var + eps).sqrt().reciprocal()
    return invstd if eps != 0 else torch.where(var == 0, torch.zeros_like(invstd), invstd)


def batch_norm_stats(input, eps):
    # -> (mean, invstd) of each channel over this rank's batch.
    torch._check(input.dim() >= 2, lambda: f"batch_norm_stats: the input needs a channel dimension, got {input.dim()} dimensions")
    var, mean = torch.var_mean(input.to(_accumulation_dtype(input.dtype)), _reduced_dims(input), correction=0)
    return mean, _inverse_std(var, eps)


def batch_norm_gather_stats_with_counts(input, mean, invstd, running_mean, running_var, momentum, eps, counts):
    # -> (mean, invstd) over all ranks, from each rank's (rows of `mean`,
    # `invstd`) and its element count per channel; updates the running
    # statistics. Ranks are merged one after another as CUDA merges them.
    acc = mean.dtype
    counts = counts.to(acc)
    n = torch.zeros((), dtype=acc, device=mean.device)
    avg = torch.zeros(mean.shape[-1], dtype=acc, device=mean.device)
    var_n = torch.zeros_like(avg)
    for rank in range(mean.shape[0]):
        count, rank_mean = counts[rank], mean[rank]
        rank_std = 1 / invstd[rank]
        rank_var_n = (rank_std * rank_std - eps) * count
        factor = 1 / (n + count)
        var_n = var_n + rank_var_n + (avg - rank_mean) * (avg - rank_mean) * n * count * factor
        avg = n * factor * avg + count * factor * rank_mean
        n = n + count
    if running_mean is not None:
        running_mean.copy_((1 - momentum) * running_mean.to(acc) + momentum * avg)
    if running_var is not None:
        running_var.copy_((1 - momentum) * running_var.to(acc) + momentum * (var_n / (n - 1)))
    return avg, 1 / (var_n / n + eps).sqrt()


def batch_norm_gather_stats(input, mean, invstd, running_mean, running_var, momentum, eps, count):
    # As above, every rank with `count` elements per channel.
    counts = torch.full((mean.shape[0],), count, dtype=mean.dtype, device=mean.device)
    return batch_norm_gather_stats_with_counts(input, mean, invstd, running_mean, running_var, momentum, eps, counts)


def batch_norm_elemt(input, weight, bias, mean, invstd, eps):
    # -> weight * (input - mean) * invstd + bias, per channel.
    acc = mean.dtype
    out = input.to(acc) - _per_channel(mean, input)
    if weight is not None:
        out = _per_channel(weight.to(acc), input) * out
    out = out * _per_channel(invstd, input)
    if bias is not None:
        out = out + _per_channel(bias.to(acc), input)
    return out.to(input.dtype)


def batch_norm_backward_reduce(grad_out, input, mean, invstd, weight, input_g, weight_g, bias_g):
    # -> (sum of grad_out, sum of grad_out * (input - mean)) per channel,
    # where the input's gradient is asked for; the weight's and the bias's
    # gradients where asked for.
    acc = mean.dtype
    dims = _reduced_dims(input)
    grad = grad_out.to(acc)
    sum_dy = grad.sum(dims)
    sum_dy_xmu = (grad * (input.to(acc) - _per_channel(mean, input))).sum(dims)
    stats_dtype = weight.dtype if weight is not None else acc
    return (
        sum_dy if input_g else None,
        sum_dy_xmu if input_g else None,
        (sum_dy_xmu * invstd).to(stats_dtype) if weight_g else None,
        sum_dy.to(stats_dtype) if bias_g else None,
    )


def batch_norm_backward_elemt(grad_out, input, mean, invstd, weight, sum_dy, sum_dy_xmu, count):
    # -> the input's gradient, from the statistics summed over all ranks;
    # `count` holds each rank's elements per channel.
    acc = mean.dtype
    norm = 1 / count.sum().to(acc)
    grad_mean = sum_dy * norm
    projection = invstd * invstd * sum_dy_xmu * norm
    scale = invstd if weight is None else weight.to(acc) * invstd
    grad = grad_out.to(acc) - _per_channel(grad_mean, input)
    grad = (grad - (input.to(acc) - _per_channel(mean, input)) * _per_channel(projection, input)) * _per_channel(scale, input)
    return grad.to(input.dtype)
