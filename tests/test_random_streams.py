"""Random numbers on flagos come from the native device's own default
generator, the one the native kernels take when a call passes none (dropout,
flash attention's dropout). So a script gives the native device's numbers
whatever mix of draws it makes, and saving, seeding or forking the flagos
RNG state covers every draw, as activation checkpointing needs.

Forward ops only against the native device (a native CUDA backward cannot run
in a process where flagos is loaded); the checkpoint test compares flagos
with itself."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import flagos_core  # noqa: F401

pytestmark = pytest.mark.native


def _script(device):
    """Draws with and without a generator argument, on CPU and on `device`."""
    torch.manual_seed(3)
    init = torch.randn(4, 4)  # a CPU draw, as a model's initialisation makes
    x = torch.randn(64, device=device)
    dropped = F.dropout(x, 0.5)  # no generator argument: the device's default
    after = torch.rand(16, device=device)
    return [init, x, dropped, after, torch.randn(4)]


def test_a_script_mixing_draws_gives_the_native_numbers(native_device):
    for got, want in zip(_script("flagos"), _script(native_device)):
        assert torch.equal(got.cpu(), want.cpu())


def test_a_restored_state_replays_draws_without_a_generator_argument(native_device):
    ones = torch.ones(256, device="flagos")
    torch.manual_seed(5)
    state = torch.flagos.get_rng_state()
    first = (F.dropout(ones, 0.3), torch.randn(8, device="flagos"), F.dropout(ones, 0.3))
    torch.flagos.set_rng_state(state)
    second = (F.dropout(ones, 0.3), torch.randn(8, device="flagos"), F.dropout(ones, 0.3))
    for a, b in zip(first, second):
        assert torch.equal(a.cpu(), b.cpu())
    assert not torch.equal(first[0].cpu(), first[2].cpu())  # the stream moved on between them
    with torch.random.fork_rng(device_type="flagos"):
        F.dropout(ones, 0.3)
    torch.flagos.set_rng_state(state)
    assert torch.equal(F.dropout(ones, 0.3).cpu(), first[0].cpu())


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpoint_recomputes_dropout_with_the_same_mask(reentrant):
    torch.manual_seed(0)
    w = torch.randn(32, 32, device="flagos", requires_grad=True)
    x = torch.randn(8, 32, device="flagos", requires_grad=reentrant)

    def block(inp):
        return F.dropout(torch.tanh(inp @ w), 0.5, training=True) @ w

    torch.manual_seed(1)
    block(x).square().sum().backward()
    plain = w.grad.clone()
    w.grad = None
    torch.manual_seed(1)
    checkpoint(block, x, use_reentrant=reentrant).square().sum().backward()
    assert torch.equal(w.grad.cpu(), plain.cpu())


def test_default_generators_are_the_devices_default_ones():
    # torch.cuda.default_generators' counterpart: seeding one seeds what
    # flagos draws from.
    gens = torch.flagos.default_generators
    assert len(gens) == torch.flagos.device_count()
    assert gens[0].device == torch.device("flagos", 0)
    gens[0].manual_seed(7)
    a = torch.randn(5, device="flagos")
    torch.flagos.manual_seed(7)
    b = torch.randn(5, device="flagos")
    assert torch.equal(a.cpu(), b.cpu()) and gens[0].initial_seed() == 7
    assert torch.flagos._get_generator(torch.device("flagos", 0)).initial_seed() == 7


def test_a_generator_of_another_device_is_refused_as_natively(native_device):
    # Native kernels refuse a generator of another device type; flagos did
    # not: a CPU one drew the CPU's numbers for flagos tensors, and a flagos
    # one brought CPU calls to flagos by its dispatch key.
    cpu_gen = torch.Generator()
    with pytest.raises(RuntimeError, match="Expected a 'flagos' device type for generator but found 'cpu'"):
        torch.randn(3, device="flagos", generator=cpu_gen)
    with pytest.raises(RuntimeError, match="Expected a 'flagos' device type for generator but found 'cpu'"):
        torch.empty(3, device="flagos").normal_(generator=cpu_gen)
    flagos_gen = torch.Generator(device="flagos")
    with pytest.raises(RuntimeError, match="Expected a 'cpu' device type for generator but found 'flagos'"):
        torch.empty(3).normal_(generator=flagos_gen)
    with pytest.raises(RuntimeError, match="Expected a 'cpu' device type for generator but found 'flagos'"):
        torch.randn(3, generator=torch.flagos.default_generators[0])
    # The call's own device's generator still works, and gives the native
    # device's numbers for the same seed.
    flagos_gen.manual_seed(5)
    got = torch.randn(3, device="flagos", generator=flagos_gen)
    native_gen = torch.Generator(device=native_device).manual_seed(5)
    assert torch.equal(got.cpu(), torch.randn(3, device=native_device, generator=native_gen).cpu())
