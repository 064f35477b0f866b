"""On the host runtime an optimizer's default implementation is CPU's
(flagos_core/_host_optimizers.py): parameters stepped on flagos equal the
CPU's bitwise, for the optimizers whose foreach and single-tensor
implementations round differently too."""

import pytest
import torch

import flagos_core

pytestmark = pytest.mark.skipif(flagos_core.runtime()["name"] != "host", reason="the host runtime's defaults")

OPTIMIZERS = {
    "NAdam": lambda params, **kw: torch.optim.NAdam(params, lr=1e-2, **kw),
    "NAdam, decoupled decay": lambda params, **kw: torch.optim.NAdam(
        params, lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True, **kw),
    "RAdam, weight decay": lambda params, **kw: torch.optim.RAdam(params, lr=1e-2, weight_decay=0.1, **kw),
    "ASGD": lambda params, **kw: torch.optim.ASGD(params, lr=1e-2, **kw),
    "AdamW": lambda params, **kw: torch.optim.AdamW(params, lr=1e-2, **kw),
}


def _stepped(device, make, **kwargs):
    torch.manual_seed(0)
    params = [torch.randn(64).to(device).requires_grad_(), torch.randn(8, 8).to(device).requires_grad_()]
    optimizer = make(params, **kwargs)
    for _ in range(5):
        optimizer.zero_grad()
        sum((p.sin() ** 2).sum() for p in params).backward()
        optimizer.step()
    return [p.detach().cpu() for p in params]


@pytest.mark.parametrize("foreach", [None, True, False], ids=["default", "foreach", "single tensor"])
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_optimizers_step_as_on_the_cpu(name, foreach):
    kwargs = {} if foreach is None else {"foreach": foreach}
    want = _stepped("cpu", OPTIMIZERS[name], **kwargs)
    got = _stepped("flagos", OPTIMIZERS[name], **kwargs)
    assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_the_default_is_the_cpus_and_foreach_stays_available():
    from torch.optim.optimizer import _default_to_fused_or_foreach

    params = [torch.zeros(2, device="flagos")]
    assert _default_to_fused_or_foreach(params, differentiable=False) == (False, False)
    # Gradient clipping takes foreach on the CPU too: flagos keeps it.
    from torch.utils._foreach_utils import _device_has_foreach_support

    assert _device_has_foreach_support(torch.device("flagos"))
