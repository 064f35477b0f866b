"""torch.flagos.amp: torch.cuda.amp's names for flagos, so code ported from
CUDA by renaming the device keeps working (`torch.flagos.amp.autocast()`,
`torch.flagos.amp.GradScaler()`, `custom_fwd`, `custom_bwd`). Each is
torch.amp's own with the device type `flagos`; new code can call torch.amp
directly. Unlike torch.cuda.amp's, these do not warn: flagos has no older
API to move users away from.
"""

import torch

__all__ = ["autocast", "GradScaler", "custom_fwd", "custom_bwd"]


class autocast(torch.amp.autocast):  # noqa: N801 (torch.cuda.amp's name)
    """`torch.autocast("flagos", ...)`. `dtype=None` takes the device's
    autocast dtype (`torch.get_autocast_dtype("flagos")`)."""

    def __init__(self, enabled=True, dtype=None, cache_enabled=True):
        super().__init__("flagos", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


class GradScaler(torch.amp.GradScaler):
    """`torch.amp.GradScaler("flagos", ...)`."""

    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000, enabled=True):
        super().__init__("flagos", init_scale=init_scale, growth_factor=growth_factor, backoff_factor=backoff_factor,
                         growth_interval=growth_interval, enabled=enabled)


def custom_fwd(fwd=None, *, cast_inputs=None):
    """`torch.amp.custom_fwd(..., device_type="flagos")`."""
    return torch.amp.custom_fwd(fwd, device_type="flagos", cast_inputs=cast_inputs)


def custom_bwd(bwd=None):
    """`torch.amp.custom_bwd(..., device_type="flagos")`."""
    return torch.amp.custom_bwd(bwd, device_type="flagos")
