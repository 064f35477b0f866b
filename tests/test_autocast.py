"""torch.autocast("flagos"): never stops an op; casts only by a native
device's policy lists, chosen by the runtime's plugin (the CUDA plugin
chooses CUDA's), and then exactly as that device's autocast would. Without
policies (the host runtime) autocast says so and turns itself off."""

import subprocess
import sys
import textwrap

import pytest
import torch

import flagos_core

pytestmark = pytest.mark.skipif(flagos_core.runtime()["name"] != "host",
                                reason="the host runtime has no policies; GPU tests cover the cuda runtime's")


def run_isolated(code):
    # Policies are process-wide and permanent: they get a process of their own.
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_without_policies_autocast_says_so_and_ops_run_uncast():
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    assert torch.flagos.get_amp_supported_dtype() == []
    with pytest.warns(UserWarning, match="Disabling autocast"):
        with torch.autocast("flagos", dtype=torch.bfloat16):
            out = a.to("flagos") @ b.to("flagos")
    assert out.dtype == torch.float32 and torch.equal(out.cpu(), a @ b)


def test_autocast_switched_off_says_nothing():
    # Model code (rotary embeddings, for one) opens torch.autocast(..., enabled=False) on every forward.
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.autocast("flagos", enabled=False):
            out = torch.ones(2, device="flagos") * 2
    assert torch.equal(out.cpu(), torch.full((2,), 2.0))


def test_autocast_switched_on_by_hand_does_not_stop_ops():
    # torch.set_autocast_enabled bypasses torch.autocast's dtype check: ops
    # without a policy pass the autocast key, as on every device.
    a = torch.randn(4, 4)
    torch.set_autocast_enabled("flagos", True)
    try:
        fa = a.to("flagos")
        out = (fa + 1).mm(fa).sum()
        filled = torch.zeros(3, device="flagos").fill_(2.0)
    finally:
        torch.set_autocast_enabled("flagos", False)
    assert out.dtype == torch.float32 and torch.equal(out.cpu(), ((a + 1).mm(a)).sum())
    assert torch.equal(filled.cpu(), torch.full((3,), 2.0))


def test_cuda_policies_cast_as_the_lists_say_and_match_cpu_where_cpu_casts_alike():
    out = run_isolated("""
        import torch, flagos_core
        flagos_core.use_autocast_policies("cuda")
        assert torch.flagos.get_amp_supported_dtype() == [torch.float16, torch.bfloat16]
        torch.manual_seed(0)
        a, b, w = torch.randn(8, 16), torch.randn(16, 4), torch.randn(4, 16)
        fa, fb, fw = a.to("flagos"), b.to("flagos"), w.to("flagos")
        for dtype in (torch.bfloat16, torch.float16):
            with torch.autocast("flagos", dtype=dtype):
                mm, lin = fa @ fb, torch.nn.functional.linear(fa, fw)          # lower_precision_fp
                exp = torch.exp(fa.to(dtype))                                  # fp32
                soft = torch.softmax(fa.to(dtype), -1)                         # fp32_set_opt_dtype
                prom = torch.addcmul(fa, fa.to(dtype), fa.to(dtype))           # promote
                plain = fa.to(dtype) + 1                                       # no policy: as it is
                norm = torch.norm(fa.to(dtype), 2)                             # different redispatch signature
            assert (mm.dtype, lin.dtype) == (dtype, dtype), (mm.dtype, lin.dtype)
            assert (exp.dtype, soft.dtype, prom.dtype, norm.dtype) == (torch.float32,) * 4
            assert plain.dtype == dtype
            # CPU's autocast casts mm and linear too: same casts, same kernels, same bits.
            with torch.autocast("cpu", dtype=dtype):
                assert torch.equal(mm.cpu(), a @ b) and torch.equal(lin.cpu(), torch.nn.functional.linear(a, w))
            assert torch.equal(exp.cpu(), torch.exp(a.to(dtype).float()))
        # Training under autocast: the backward runs, gradients in the parameters' dtype.
        x = torch.randn(4, 16, device="flagos", requires_grad=True)
        with torch.autocast("flagos", dtype=torch.bfloat16):
            loss = torch.nn.functional.linear(x, fw).float().pow(2).mean()
        loss.backward()
        assert x.grad.dtype == torch.float32 and x.grad.device.type == "flagos"
        # Outside autocast nothing is cast.
        assert (fa @ fb).dtype == torch.float32
        # binary_cross_entropy is refused under autocast, as on CUDA; outside it runs.
        p, y = torch.rand(4, device="flagos"), torch.rand(4, device="flagos")
        try:
            with torch.autocast("flagos", dtype=torch.bfloat16):
                torch.nn.functional.binary_cross_entropy(p, y)
        except RuntimeError as error:
            print("bce:", error)
        assert torch.equal(torch.nn.functional.binary_cross_entropy(p, y).cpu(),
                           torch.nn.functional.binary_cross_entropy(p.cpu(), y.cpu()))
        try:
            flagos_core.use_autocast_policies("xpu")
        except RuntimeError as error:
            print("switch:", error)
        """)
    assert "switch: flagos: autocast already casts as cuda; it cannot switch to xpu" in out
    assert "bce: flagos: binary_cross_entropy (nn.BCELoss) cannot run under torch.autocast" in out


def test_unknown_policies_name_the_known_ones():
    out = run_isolated("""
        import flagos_core
        try:
            flagos_core.use_autocast_policies("tpu")
        except RuntimeError as error:
            print(error)
        """)
    assert "no autocast policies for device 'tpu'; known: cuda" in out
