"""torch.autocast("flagos"): never stops an op; casts by the policy lists of
the native device the runtime runs (the host runtime: CPU's, the CUDA
plugin: CUDA's, tested on the GPU), and then exactly as that device's
autocast would: the same casts, the same kernels, the same bits."""

import functools
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import flagos_core

pytestmark = pytest.mark.skipif(flagos_core.runtime()["name"] != "host",
                                reason="the host runtime's policies are CPU's; test_cuda_plugin.py covers CUDA's")

DTYPES = (torch.bfloat16, torch.float16)


def run_isolated(code):
    # Policies are process-wide and permanent: a process of its own.
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def _both(fn, dtype, *cpu_args):
    """fn's results under torch.autocast("cpu") on the CPU arguments and
    under torch.autocast("flagos") on flagos copies, the latter on the CPU."""
    flagos_args = [a.to("flagos") if isinstance(a, torch.Tensor) else a for a in cpu_args]
    with torch.autocast("cpu", dtype=dtype):
        expected = fn(*cpu_args)
    with torch.autocast("flagos", dtype=dtype):
        got = fn(*flagos_args)
    return got, expected


def _assert_same(got, expected):
    got = got if isinstance(got, (tuple, list)) else (got,)
    expected = expected if isinstance(expected, (tuple, list)) else (expected,)
    for g, e in zip(got, expected, strict=True):
        assert g.device.type == "flagos"
        assert g.dtype == e.dtype, (g.dtype, e.dtype)
        assert torch.equal(g.cpu(), e), (g.cpu() - e).abs().max()


def test_the_host_runtime_casts_the_ops_cpu_casts():
    # The same set of ops as the installed PyTorch's CPU autocast, no more, no fewer.
    cpu = set(torch._C._dispatch_get_registrations_for_dispatch_key("AutocastCPU"))
    flagos = set(torch._C._dispatch_get_registrations_for_dispatch_key("AutocastPrivateUse1"))
    assert flagos == cpu, {"only on cpu": sorted(cpu - flagos), "only on flagos": sorted(flagos - cpu)}
    assert torch.flagos.get_amp_supported_dtype() == [torch.float16, torch.bfloat16]
    assert torch.get_autocast_dtype("flagos") == torch.get_autocast_dtype("cpu") == torch.bfloat16


@pytest.mark.parametrize("dtype", DTYPES)
def test_ops_cast_and_compute_as_under_cpu_autocast(dtype):
    g = torch.Generator().manual_seed(0)
    a, b, w = torch.randn(8, 16, generator=g), torch.randn(16, 4, generator=g), torch.randn(4, 16, generator=g)
    batch = torch.randn(3, 8, 16, generator=g)
    image, kernel = torch.randn(1, 2, 6, 6, generator=g), torch.randn(3, 2, 3, 3, generator=g)
    q, kv = torch.randn(1, 2, 4, 8, generator=g), torch.randn(1, 2, 5, 8, generator=g)
    target = torch.randint(0, 4, (8,), generator=g)
    p, y = torch.rand(8, generator=g), torch.rand(8, generator=g)
    F = torch.nn.functional
    cases = {
        # to the autocast dtype
        "mm": (lambda x, z: x @ z, a, b),
        "linear": (F.linear, a, w),
        "bmm": (lambda x, z: torch.bmm(x, z.expand(3, 16, 4)), batch, b),
        "baddbmm": (lambda x, z: torch.baddbmm(x.new_zeros(3, 8, 4), x, z.expand(3, 16, 4)), batch, b),
        "conv2d": (F.conv2d, image, kernel),
        "sdpa": (F.scaled_dot_product_attention, q, kv, kv),
        # to float32
        "cross_entropy": (lambda x, t: F.cross_entropy(x.to(dtype), t), (a @ b), target),
        "mse_loss": (lambda x, z: F.mse_loss(x.to(dtype), z.to(dtype)), a, a.flip(0)),
        "binary_cross_entropy": (lambda x, z: F.binary_cross_entropy(x.to(dtype), z), p, y),
        "prod": (lambda x: torch.prod(x.to(dtype), 1), a),
        "cdist": (lambda x: torch.cdist(x.to(dtype), x.to(dtype)), a),
        "rfft": (lambda x: torch.fft.rfft(x.to(dtype)), a),
        # the widest type among the inputs
        "cat": (lambda x: torch.cat((x.to(dtype), x)), a),
        "stack": (lambda x: torch.stack((x, x.to(dtype))), a),
        # no policy on CPU: as it is
        "softmax": (lambda x: torch.softmax(x.to(dtype), -1), a),
        "exp": (lambda x: torch.exp(x.to(dtype)), a),
        "layer_norm": (lambda x: F.layer_norm(x.to(dtype), (16,)), a),
    }
    for name, (fn, *args) in cases.items():
        got, expected = _both(fn, dtype, *args)
        try:
            _assert_same(got, expected)
        except AssertionError as error:
            raise AssertionError(f"{name}: {error}") from None


def test_a_training_step_under_autocast_equals_cpus():
    def step(device):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                                    torch.nn.Linear(32, 5)).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(1)
        x, t = torch.randn(8, 16, generator=g).to(device), torch.randint(0, 5, (8,), generator=g).to(device)
        losses = []
        for _ in range(2):
            with torch.autocast(device.split(":")[0]):  # the default dtype: bfloat16 on both
                loss = torch.nn.functional.cross_entropy(model(x), t)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach().cpu())
        return losses, [p.detach().cpu() for p in model.parameters()]

    cpu_losses, cpu_params = step("cpu")
    flagos_losses, flagos_params = step("flagos")
    assert all(loss.dtype == torch.float32 for loss in flagos_losses)
    assert all(torch.equal(f, c) for f, c in zip(flagos_losses, cpu_losses))
    assert all(torch.equal(f, c) for f, c in zip(flagos_params, cpu_params))


@pytest.mark.parametrize("ported", [False, True], ids=["torch.amp", "torch.flagos.amp"])
@pytest.mark.parametrize("init_scale", [2.0**16, 2.0**40])  # the second overflows: steps skipped, scale cut
def test_float16_training_with_a_grad_scaler_equals_cpus(init_scale, ported):
    # GradScaler("flagos") unscales and checks for infs with the native
    # device's kernels: the same scale, losses and parameters as on CPU.
    # `ported`: through torch.flagos.amp, as code ported from torch.cuda.amp.
    def step(device):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 5)).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        if ported and device == "flagos":
            from torch.flagos.amp import GradScaler

            scaler, autocast = GradScaler(init_scale=init_scale), torch.flagos.amp.autocast
        else:
            scaler = torch.amp.GradScaler(device, init_scale=init_scale)
            autocast = functools.partial(torch.autocast, device)
        g = torch.Generator().manual_seed(1)
        x, t = torch.randn(8, 16, generator=g).to(device), torch.randint(0, 5, (8,), generator=g).to(device)
        losses = []
        for _ in range(3):
            with autocast(dtype=torch.float16):
                loss = torch.nn.functional.cross_entropy(model(x), t)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            losses.append(loss.detach().cpu())
        return losses, [p.detach().cpu() for p in model.parameters()], scaler.get_scale()

    with flagos_core.trace() as t:
        flagos = step("flagos")
    cpu = step("cpu")
    assert t.fallbacks == []
    assert all(torch.equal(f, c) for f, c in zip(flagos[0], cpu[0]))
    assert all(torch.equal(f, c) for f, c in zip(flagos[1], cpu[1]))
    assert flagos[2] == cpu[2] and (flagos[2] < init_scale) == (init_scale > 2.0**16)


def test_torch_flagos_amp_is_torch_amp_for_flagos():
    # torch.cuda.amp's names: autocast with the device's own dtype when none
    # is given, and custom_fwd casting inputs under it.
    with torch.flagos.amp.autocast():
        assert torch.get_autocast_dtype("flagos") == torch.flagos.amp.autocast().fast_dtype
        assert torch.is_autocast_enabled("flagos")
    assert not torch.is_autocast_enabled("flagos")

    class Double(torch.autograd.Function):
        @staticmethod
        @torch.flagos.amp.custom_fwd(cast_inputs=torch.float32)
        def forward(ctx, x):
            return x * 2

        @staticmethod
        @torch.flagos.amp.custom_bwd
        def backward(ctx, grad):
            return grad * 2

    x = torch.ones(3, device="flagos", dtype=torch.bfloat16, requires_grad=True)
    with torch.flagos.amp.autocast(dtype=torch.bfloat16):
        y = Double.apply(x)
    assert y.dtype == torch.float32  # the input was cast as custom_fwd asked
    y.sum().backward()
    assert torch.equal(x.grad.cpu(), torch.full((3,), 2.0, dtype=torch.bfloat16))


def test_autocast_says_nothing_entering_or_switched_off():
    # Model code (rotary embeddings, for one) opens torch.autocast(..., enabled=False) on every forward.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.autocast("flagos", enabled=False):
            off = torch.ones(2, 2, device="flagos") @ torch.ones(2, 2, device="flagos")
        with torch.autocast("flagos"):
            on = torch.ones(2, 2, device="flagos") @ torch.ones(2, 2, device="flagos")
    assert off.dtype == torch.float32 and on.dtype == torch.bfloat16


def test_autocast_switched_on_by_hand_casts_as_cpu_and_does_not_stop_other_ops():
    # torch.set_autocast_enabled bypasses torch.autocast's checks: ops with a
    # policy cast as CPU's, the others pass the autocast key, as on every device.
    a = torch.randn(4, 4)
    torch.set_autocast_enabled("flagos", True)
    try:
        fa = a.to("flagos")
        mm = fa.mm(fa)
        out = (fa + 1).sum()
        filled = torch.zeros(3, device="flagos").fill_(2.0)
    finally:
        torch.set_autocast_enabled("flagos", False)
    with torch.autocast("cpu"):
        expected_mm = a.mm(a)
    assert mm.dtype == torch.bfloat16 and torch.equal(mm.cpu(), expected_mm)
    assert out.dtype == torch.float32 and torch.equal(out.cpu(), (a + 1).sum())
    assert torch.equal(filled.cpu(), torch.full((3,), 2.0))


def test_policies_cannot_switch_and_unknown_ones_name_the_known():
    out = run_isolated("""
        import flagos_core
        for device in ("cpu", "cuda", "tpu"):
            try:
                flagos_core.use_autocast_policies(device)
                print(device, "ok")
            except RuntimeError as error:
                print(device, str(error).splitlines()[0])
        """)
    assert "cpu ok" in out
    assert "cuda flagos: autocast already casts as cpu; it cannot switch to cuda in the same process" in out
    assert "tpu flagos: no autocast policies for device 'tpu'; known: cpu, cuda" in out
