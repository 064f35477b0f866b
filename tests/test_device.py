"""The flagos device behaves like its native device (CPU on the host runtime)."""

import pytest
import torch

import flagos_core
from native_reference import results_on_native


def test_device_is_registered():
    assert torch._C._get_privateuse1_backend_name() == "flagos"
    assert torch.flagos.is_available()
    assert torch.flagos.device_count() == flagos_core.runtime()["device_count"] >= 1
    x = torch.ones(2, device="flagos")
    assert x.device.type == "flagos" and x.is_flagos


@pytest.mark.native
def test_arithmetic_matches_the_native_device_bitwise(native_device):
    torch.manual_seed(0)
    a, b = torch.randn(17, 33).to(native_device), torch.randn(33, 5).to(native_device)
    fa, fb = a.to("flagos"), b.to("flagos")
    assert torch.equal((fa @ fb).cpu(), (a @ b).cpu())
    assert torch.equal((fa.sin() * 3 + fa.exp()).cpu(), (a.sin() * 3 + a.exp()).cpu())
    assert torch.equal(fa.sum(dim=1).cpu(), a.sum(dim=1).cpu())
    assert torch.equal(torch.softmax(fa, -1).cpu(), torch.softmax(a, -1).cpu())


@pytest.mark.native
def test_new_memory_reads_as_on_the_native_device_under_deterministic_algorithms(native_device):
    # With deterministic algorithms, the native devices fill new memory (NaN,
    # an integer type's largest value) so that a read of memory never written
    # shows; flagos's own allocation kernels must do the same.
    def made(device):
        like = torch.zeros(3, device=device)
        return [torch.empty(5, device=device), torch.empty(2, 3, dtype=torch.int64, device=device),
                torch.empty_strided((2, 2), (1, 2), dtype=torch.float16, device=device), torch.empty_like(like),
                like.new_empty(4, dtype=torch.bool)]

    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert torch.utils.deterministic.fill_uninitialized_memory
        for got, want in zip(made(torch.device("flagos")), made(native_device)):
            assert got.device.type == "flagos"
            assert got.dtype == want.dtype and got.stride() == want.stride()
            torch.testing.assert_close(got.cpu(), want.cpu(), rtol=0, atol=0, equal_nan=True)
    finally:
        torch.use_deterministic_algorithms(previous)


def test_views_share_memory():
    x = torch.zeros(4, 4, device="flagos")
    v = x.view(16)[3:7]
    v.fill_(2.0)
    assert x.cpu().view(16)[3:7].eq(2).all()
    assert x.untyped_storage().data_ptr() == v.untyped_storage().data_ptr()
    t = x.t()
    t[0, 1] = 5
    assert x[1, 0].item() == 5


def test_out_variant_resizes_the_flagos_tensor():
    a = torch.arange(6.0).to("flagos")
    out = torch.empty(0, device="flagos")
    result = torch.add(a, a, out=out)
    assert result is out
    assert out.shape == (6,)
    assert torch.equal(out.cpu(), torch.arange(6.0) * 2)


def test_in_place_returns_self():
    a = torch.ones(3, device="flagos")
    assert a.add_(1) is a
    assert torch.equal(a.cpu(), torch.full((3,), 2.0))


@pytest.mark.native
def test_autograd_matches_the_native_device(native_device, tmp_path):
    def gradient(device):
        torch.manual_seed(1)
        w = torch.randn(8, 4).to(device).requires_grad_()
        x = torch.randn(3, 8).to(device)
        (x @ w).tanh().sum().backward()
        return [w.grad]

    (flagos_grad,) = gradient(torch.device("flagos"))
    (native_grad,) = results_on_native(gradient, native_device, tmp_path)
    assert flagos_grad.device.type == "flagos"
    assert torch.equal(flagos_grad.cpu(), native_grad)


@pytest.mark.native
def test_convolution_and_its_backward_match_the_native_device(native_device, tmp_path):
    # Convolutions reach flagos as convolution_overrideable; the core runs
    # the native one on aliases. Its results are flagos's own tensors, which
    # can grow like any other (they were wrapped, and resize_ raised).
    def convolve(device):
        # cuDNN's deterministic algorithms, on both sides: a weight gradient
        # may otherwise add in a varying order.
        deterministic, torch.backends.cudnn.deterministic = torch.backends.cudnn.deterministic, True
        try:
            torch.manual_seed(2)
            x, w, b = torch.randn(2, 4, 9, 9), torch.randn(6, 4, 3, 3), torch.randn(6)
            xs, ws, bs = (t.to(device).detach().requires_grad_() for t in (x, w, b))
            y = torch.nn.functional.conv2d(xs, ws, bs, padding=1)
            y.square().sum().backward()
            return [y.detach(), xs.grad, ws.grad, bs.grad]
        finally:
            torch.backends.cudnn.deterministic = deterministic

    flagos = convolve(torch.device("flagos"))
    native = results_on_native(convolve, native_device, tmp_path)
    for got, want in zip(flagos, native):
        assert torch.equal(got.cpu(), want)
    grown, n = flagos[0], flagos[0].numel()  # the convolution's own result, detached
    grown.resize_(2 * n)
    assert torch.equal(grown[:n].view_as(native[0]).cpu(), native[0])


@pytest.mark.skipif(flagos_core.runtime()["name"] != "host",
                    reason="the host runtime draws as CPU does; the CUDA plugin's draws are checked against CUDA's")
def test_seeded_random_matches_cpu():
    for make in (
        lambda d: torch.randn(100, device=d),
        lambda d: torch.rand(100, device=d),
        lambda d: torch.randint(0, 1000, (100,), device=d),
    ):
        torch.manual_seed(1234)
        expected = make("cpu")
        torch.manual_seed(1234)
        got = make("flagos")
        assert torch.equal(got.cpu(), expected)


@pytest.mark.skipif(flagos_core.runtime()["name"] != "host", reason="the host runtime's generator is CPU's")
def test_flagos_draws_from_the_cpu_generator():
    # The host device's generator is CPU's default one: CPU draws move it.
    torch.flagos.manual_seed(7)
    assert torch.initial_seed() == 7
    state = torch.flagos.get_rng_state()
    first = torch.randn(5, device="flagos")
    torch.flagos.set_rng_state(state)
    assert torch.equal(torch.randn(5).cpu(), first.cpu())


def test_mixing_flagos_and_cpu_is_the_usual_error():
    a = torch.ones(3, device="flagos")
    # add is a typed kernel, atan2 a boxed one: both name the argument.
    for op, name in ((torch.add, "aten::add.Tensor"), (torch.atan2, "aten::atan2")):
        try:
            op(a, torch.ones(3))
        except RuntimeError as e:
            assert "Expected all tensors to be on the same device" in str(e)
            assert "flagos:0" in str(e) and "cpu" in str(e)
            assert "argument other" in str(e) and name in str(e), str(e)
        else:
            raise AssertionError(f"{name}: mixing flagos and cpu tensors did not raise")
    # A 0-dim CPU tensor is a scalar, as on other accelerators.
    assert torch.equal((a + torch.tensor(2.0)).cpu(), torch.full((3,), 3.0))


def test_a_cpu_scalar_is_read_but_never_written():
    # Native accelerators read a 0-dim CPU tensor as a scalar but refuse it as
    # what a kernel writes: an out= tensor or the self of an in-place op.
    a = torch.ones(3, device="flagos")
    for write in (lambda c: torch.add(a, 1, out=c), lambda c: torch.eq(a, a, out=c),
                  lambda c: c.add_(torch.tensor(2.0, device="flagos")), lambda c: c.mul_(a[0])):
        cpu = torch.tensor(1.0)
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
            write(cpu)
        assert cpu.shape == () and cpu.item() == 1.0  # neither written nor resized
    # Read, it is a scalar, in place or not.
    a.add_(torch.tensor(1.0))
    assert torch.equal(torch.add(a, torch.tensor(1.0)).cpu(), torch.full((3,), 3.0))


def test_set_onto_another_devices_storage_is_refused_as_natively():
    # The native kernel would see its own device on both sides (the alias)
    # and relabel the CPU tensor's memory as flagos's under its owner.
    owner = torch.ones(3)
    storage = owner.untyped_storage()
    for set_onto in (lambda t: t.set_(storage), lambda t: t.set_(storage, 0, (3,), (1,)),
                     lambda t: t.set_(owner.storage())):
        with pytest.raises(RuntimeError, match='Attempted to set the storage of a tensor on device "flagos:0" to a '
                                               'storage on different device "cpu"'):
            set_onto(torch.empty(0, device="flagos"))
    assert owner.untyped_storage().device.type == "cpu" and torch.equal(owner, torch.ones(3))
    assert repr(owner) == "tensor([1., 1., 1.])"
    # A flagos storage, as before.
    source = torch.arange(3.0, device="flagos")
    assert torch.equal(torch.empty(0, device="flagos").set_(source.untyped_storage()).cpu(), torch.arange(3.0))


@pytest.mark.skipif(flagos_core.runtime()["name"] != "host", reason="an overload that only CUDA implements")
def test_an_overload_no_provider_serves_is_a_clear_error():
    # _fused_dropout has a CUDA kernel only: neither the host provider nor
    # cpu_fallback (which runs CPU's) can serve it.
    with pytest.raises(NotImplementedError, match="flagos: no provider has a kernel for aten::_fused_dropout "
                                                  "on the host runtime"):
        torch._fused_dropout(torch.ones(4, device="flagos"), 0.5)


def test_inference_mode_results_are_inference_tensors():
    x = torch.randn(4, 3)
    a = x.to("flagos")
    with torch.inference_mode():
        for got, want in ((a * 2, x * 2), ((a * 2).view(3, 4) + 1, (x * 2).view(3, 4) + 1)):
            assert got.device.type == "flagos" and got.is_inference() and not got.requires_grad
            assert torch.equal(got.cpu(), want)
    # Outside it, results take part in autograd again.
    b = a.clone().requires_grad_()
    (b * 3).sum().backward()
    assert not (b * 3).is_inference()
    assert torch.equal(b.grad.cpu(), torch.full((4, 3), 3.0))


def test_module_and_tensor_methods():
    m = torch.nn.Linear(3, 2).flagos()
    assert next(m.parameters()).device.type == "flagos"
    assert torch.ones(2).flagos().device.type == "flagos"
    s = torch.ones(2).untyped_storage().flagos()
    assert s.device.type == "flagos"


@pytest.mark.skipif(flagos_core.runtime()["name"] != "host",
                    reason="compares with CPU's guard; torch 2.11's CUDA guard gives no capabilities (its own error)")
def test_device_capability_is_the_native_devices():
    if not hasattr(torch.accelerator, "get_device_capability"):
        pytest.skip("this torch has no torch.accelerator.get_device_capability")
    # The native device's answer (CPU's guard: every dtype); before, torch's
    # default for a backend without one: an error.
    caps = torch.accelerator.get_device_capability("flagos:0")["supported_dtypes"]
    assert {torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool, torch.complex64} <= caps
    assert caps == torch.accelerator.get_device_capability()["supported_dtypes"]
    bad = torch.flagos.device_count() + 1
    with pytest.raises(RuntimeError, match=f"flagos:{bad} is not a valid device"):
        torch.accelerator.get_device_capability(bad)


def test_device_index_out_of_range_names_the_valid_devices():
    count = torch.flagos.device_count()
    bad = count + 3
    valid = f"flagos:0 to flagos:{count - 1}"
    for what, call in (
        ("set_device", lambda: torch.flagos.set_device(bad)),
        ("current_stream", lambda: torch.flagos.current_stream(bad)),
        ("Stream", lambda: torch.flagos.Stream(device=bad)),
    ):
        try:
            call()
        except RuntimeError as e:
            assert f"flagos:{bad} is not a valid device" in str(e) and valid in str(e), (what, str(e))
        else:
            raise AssertionError(f"{what}({bad}) did not raise")
    # Valid indices still work, and the current stream round-trips.
    s = torch.flagos.Stream(device=count - 1)
    with torch.flagos.stream(s):
        assert torch.flagos.current_stream(count - 1) == s
    assert torch.flagos.current_stream(count - 1) != s


@pytest.mark.native
def test_setting_data_moves_a_parameter_as_on_the_native_device(native_device, tmp_path):
    # `param.data = param.to(device)`: how model code and FSDP2's fully_shard
    # move parameters in place. PyTorch allows it between CPU and its own
    # accelerators; flagos the same, both ways, in inference mode too.
    def step(device):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 3)
        params = list(model.parameters())
        for p in params:
            p.data = p.data.to(device)
        assert [p.device.type for p in model.parameters()] == [device.type] * 2
        assert all(a is b for a, b in zip(params, model.parameters()))  # the same Parameter objects
        model(torch.ones(2, 4, device=device)).square().sum().backward()
        back = torch.nn.Parameter(torch.ones(2, device=device))
        back.data = back.data.cpu()
        with torch.inference_mode():
            plain = torch.ones(2)
            plain.data = torch.zeros(2, device=device)
        assert back.device.type == "cpu" and plain.device.type == device.type
        return [model.weight.grad, model.bias.grad]

    flagos_grads = step(torch.device("flagos"))
    native_grads = results_on_native(step, native_device, tmp_path)
    assert all(g.device.type == "flagos" for g in flagos_grads)
    assert all(torch.equal(f.cpu(), n.cpu()) for f, n in zip(flagos_grads, native_grads))
    with pytest.raises(RuntimeError, match="incompatible tensor type"):  # sparse data stays refused, as natively
        torch.ones(2, device="flagos").data = torch.ones(2).to_sparse()


def test_a_nested_trace_counts_its_own_calls():
    x = torch.ones(3, device="flagos")
    with flagos_core.trace() as outer:
        x.neg()
        with flagos_core.trace() as inner:
            x.exp()
        with flagos_core.trace() as second:
            x.sin()
        x.cos()
    assert {op for op, _ in inner.counts} == {"exp"}
    assert {op for op, _ in second.counts} == {"sin"}
    assert {"neg", "exp", "sin", "cos"} <= {op for op, _ in outer.counts}
