"""Composite ops that choose their kernel by the tensor's device type take
the native device's choice on flagos (core/NativeChoices.cpp): batch_norm
(and instance_norm, which calls it), grid_sampler and ctc_loss take cuDNN
where native CUDA does, so outputs, gradients and running statistics equal the native
device's bitwise, and the trace shows the native device's kernels. dropout
fuses where the native device's does (CUDA), and multiplies by a scaled
mask where it does not (CPU, the host runtime). one_hot checks its classes
as the native device does (codegen/whole_ops.txt runs it whole). One tensor
in several arguments reaches the native kernel as one tensor (multi-head
attention fuses its projection for self-attention)."""

import pytest
import torch
import torch.nn.functional as F

import flagos_core
from native_reference import assert_matches_native, native_device, results_on_native

pytestmark = pytest.mark.native


def _cudnn_expected():
    # The native device takes cuDNN for these where it is CUDA with cuDNN on.
    return native_device().type == "cuda" and torch.backends.cudnn.is_available() and torch.backends.cudnn.enabled


def _normalisation(device, training=True):
    # Self-contained: on an accelerator it runs in a side process. cuDNN's
    # deterministic convolutions on both sides (its default backward ones sum
    # in varying order); outputs, gradients, then running statistics.
    deterministic, torch.backends.cudnn.deterministic = torch.backends.cudnn.deterministic, True
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
            torch.nn.InstanceNorm2d(4, affine=True, track_running_stats=True), torch.nn.Conv2d(4, 2, 1),
            torch.nn.Flatten(), torch.nn.BatchNorm1d(72))
        model = model.to(device).train(training)
        x = torch.randn(6, 3, 8, 8).to(device)
        results = []
        for _ in range(2):
            out = model(x)
            if training:
                out.square().sum().backward()
            results.append(out.detach())
        results += [p.grad for p in model.parameters()] if training else []
        return results + list(model.buffers())  # running statistics and batch counts
    finally:
        torch.backends.cudnn.deterministic = deterministic


@pytest.mark.parametrize("training", [True, False], ids=["training", "eval"])
def test_batch_norm_and_instance_norm_equal_the_native_device(tmp_path, training):
    native = results_on_native(_normalisation, native_device(), tmp_path, training=training)
    with flagos_core.trace() as t:
        flagos = _normalisation(torch.device("flagos"), training=training)
    assert t.fallbacks == []
    assert_matches_native(flagos, native)
    calls = {op: n for (op, _), n in t.counts.items()}
    # Per forward: BatchNorm2d and InstanceNorm2d, whose 4-D inputs cuDNN
    # takes on CUDA, and BatchNorm1d, whose 2-D input it does not take there
    # either (PyTorch's selection asks for 3 dimensions or more).
    if _cudnn_expected():
        assert calls.get("cudnn_batch_norm") == 4 and calls.get("native_batch_norm") == 2
        assert calls.get("cudnn_batch_norm_backward", 0) == (4 if training else 0)
    else:
        assert calls.get("native_batch_norm") == 6 and "cudnn_batch_norm" not in calls


def _grid_sample(device):
    torch.manual_seed(1)
    outputs, gradients = [], []
    for align_corners in (True, False):
        inp = torch.randn(2, 3, 8, 8).to(device).requires_grad_()
        grid = (torch.rand(2, 5, 6, 2) * 2 - 1).to(device).requires_grad_()
        out = torch.nn.functional.grid_sample(inp, grid, align_corners=align_corners)
        out.square().sum().backward()
        outputs.append(out.detach())
        gradients += [inp.grad, grid.grad]
    return outputs + gradients


def test_grid_sample_equals_the_native_device(tmp_path):
    native = results_on_native(_grid_sample, native_device(), tmp_path)
    with flagos_core.trace() as t:
        flagos = _grid_sample(torch.device("flagos"))
    assert t.fallbacks == []
    assert_matches_native(flagos[:2], native[:2])  # the outputs: bitwise
    # The gradients to rounding: CUDA's sampler backward adds into the input
    # gradient with atomics, in an order that varies from run to run.
    assert_matches_native(flagos[2:], native[2:], rtol=1e-5, atol=1e-6)
    ops = {op for (op, _) in t.counts}
    # cuDNN's sampler serves bilinear, zero padding and align_corners=True only.
    assert ("cudnn_grid_sampler" in ops) == _cudnn_expected()
    assert "grid_sampler_2d" in ops


def _ctc(device, targets_on_device=False):
    # Self-contained. Losses and log_probs gradients for every reduction and
    # zero_infinity off and on, with lengths as lists and as tensors, and one
    # unbatched input. The forms native CUDA gives cuDNN: with lists, int32
    # targets on the CPU (targets_on_device: on the device, which it does not
    # give cuDNN) and every input as long as log_probs; with tensors, int32
    # targets and lengths on the device.
    torch.manual_seed(2)
    steps, batch, classes, target_lengths = 30, 3, 12, [5, 12, 1]
    results = []
    for reduction in ("none", "mean", "sum"):
        for zero_infinity in (False, True):
            for lengths_as_tensors in (False, True):
                log_probs = torch.randn(steps, batch, classes).log_softmax(2).to(device).requires_grad_()
                targets = torch.randint(1, classes, (sum(target_lengths),), dtype=torch.int32)
                inputs, labels = [steps] * batch, target_lengths
                if lengths_as_tensors:
                    inputs = torch.tensor(inputs, dtype=torch.int32).to(device)
                    labels = torch.tensor(labels, dtype=torch.int32).to(device)
                if lengths_as_tensors or targets_on_device:
                    targets = targets.to(device)
                loss = torch.nn.functional.ctc_loss(
                    log_probs, targets, inputs, labels, reduction=reduction, zero_infinity=zero_infinity)
                loss.sum().backward()
                results += [loss.detach(), log_probs.grad]
    log_probs = torch.randn(steps, classes).log_softmax(1).to(device).requires_grad_()
    targets = torch.randint(1, classes, (7,), dtype=torch.int32)
    loss = torch.nn.functional.ctc_loss(log_probs, targets.to(device) if targets_on_device else targets, [steps], [7])
    loss.backward()
    return results + [loss.detach(), log_probs.grad]


def test_ctc_loss_equals_the_native_device(tmp_path):
    native = results_on_native(_ctc, native_device(), tmp_path)
    with flagos_core.trace() as t:
        flagos = _ctc(torch.device("flagos"))
    assert t.fallbacks == []
    assert_matches_native(flagos, native)
    calls = {op: n for (op, _), n in t.counts.items()}
    # Thirteen losses: cuDNN's on CUDA (seven with lengths as lists, six as
    # tensors), the native kernel elsewhere.
    if _cudnn_expected():
        assert calls.get("_cudnn_ctc_loss") == 7 and calls.get("_cudnn_ctc_loss.Tensor") == 6
        assert "_ctc_loss" not in calls
    else:
        assert calls.get("_ctc_loss") == 13 and "_cudnn_ctc_loss" not in calls


def test_ctc_loss_with_targets_on_the_device_takes_the_native_kernel(tmp_path):
    # With lengths as lists, targets on the device: cuDNN's branch is not
    # taken natively either.
    native = results_on_native(_ctc, native_device(), tmp_path, targets_on_device=True)
    with flagos_core.trace() as t:
        flagos = _ctc(torch.device("flagos"), targets_on_device=True)
    assert t.fallbacks == []
    assert_matches_native(flagos[0::2], native[0::2])  # the losses: bitwise
    # The gradients to rounding: CUDA's CTC backward may add with atomics.
    assert_matches_native(flagos[1::2], native[1::2], rtol=1e-5, atol=1e-6)
    calls = {op: n for (op, _), n in t.counts.items()}
    assert "_cudnn_ctc_loss" not in calls
    assert calls.get("_ctc_loss") == (7 if _cudnn_expected() else 13)


def _ctc_with_targets_on_the_cpu(device):
    # Self-contained. Two forms with int32 targets on the CPU that cuDNN's
    # list branch does not take: lengths as tensors on the device, and
    # float64 log_probs with lengths as lists. The CPU computes both, and so
    # does native CUDA (2.11: the first through cuDNN's tensor overload,
    # whose kernel moves the targets to the GPU). Each form gives its loss
    # and gradient, or -1 twice where ctc_loss raised.
    torch.manual_seed(3)
    steps, batch, classes, target_lengths = 20, 2, 9, [4, 6]
    results = []
    for lengths_as_tensors, dtype in ((True, torch.float32), (False, torch.float64)):
        log_probs = torch.randn(steps, batch, classes, dtype=dtype).log_softmax(2).to(device).requires_grad_()
        targets = torch.randint(1, classes, (sum(target_lengths),), dtype=torch.int32)
        inputs, labels = [steps] * batch, target_lengths
        if lengths_as_tensors:
            inputs = torch.tensor(inputs, dtype=torch.int32).to(device)
            labels = torch.tensor(labels, dtype=torch.int32).to(device)
        try:
            loss = torch.nn.functional.ctc_loss(log_probs, targets, inputs, labels)
            loss.backward()
            results += [loss.detach(), log_probs.grad]
        except RuntimeError:
            results += [torch.full((1,), -1.0, device=device)] * 2
    return results


def test_ctc_loss_with_targets_on_the_cpu_does_what_the_native_device_does(tmp_path):
    # No silent difference: flagos computes these forms where the native
    # device does (equal results) and raises where it raises.
    native = results_on_native(_ctc_with_targets_on_the_cpu, native_device(), tmp_path)
    flagos = _ctc_with_targets_on_the_cpu(torch.device("flagos"))
    assert_matches_native(flagos[0::2], native[0::2])  # the losses: bitwise
    assert_matches_native(flagos[1::2], native[1::2], rtol=1e-5, atol=1e-6)
    if native_device().type == "cpu":
        assert all(loss.numel() == 1 and loss.item() > 0 for loss in flagos[0::2])  # computed, not refused


def _dropout(device):
    # Self-contained. Outputs and input gradients in three dtypes and two
    # probabilities (half precision rounds differently on the two paths),
    # then the cases every device treats alike, and inference mode.
    results = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for p in (0.1, 0.5):
            torch.manual_seed(3)
            x = torch.randn(4096, dtype=dtype).to(device).requires_grad_()
            grad = torch.randn(4096, dtype=dtype).to(device)
            y = torch.nn.functional.dropout(x, p)
            y.backward(grad)
            results += [y.detach(), x.grad]
    x = torch.randn(8, 8).to(device)
    results += [torch.nn.functional.dropout(x, 0.0), torch.nn.functional.dropout(x, 1.0),
                torch.nn.functional.dropout(x, 0.3, training=False), torch.nn.Dropout(0.3)(x)]
    with torch.inference_mode():
        results.append(torch.nn.functional.dropout(x, 0.3))
    return results


def test_dropout_takes_the_native_devices_path(tmp_path):
    native = results_on_native(_dropout, native_device(), tmp_path)
    assert_matches_native(_dropout(torch.device("flagos")), native)
    y = torch.nn.functional.dropout(torch.ones(8, device="flagos", requires_grad=True), 0.5)
    fused = native_device().type == "cuda"
    assert y.grad_fn.name() == ("NativeDropoutBackward0" if fused else "MulBackward0")
    with pytest.raises(ValueError, match="dropout probability has to be between 0 and 1"):
        torch.nn.functional.dropout(torch.ones(8, device="flagos"), 1.5)


def test_the_choice_follows_the_native_switch():
    # With cuDNN switched off the native device takes its own kernels, and so
    # does flagos (the selection reads the same switch).
    x = torch.randn(4, 3, 5, 5, device="flagos")
    bn = torch.nn.BatchNorm2d(3).to("flagos")
    with torch.backends.cudnn.flags(enabled=False), flagos_core.trace() as t:
        bn(x)
    ops = {op for (op, _) in t.counts}
    assert "native_batch_norm" in ops and "cudnn_batch_norm" not in ops


def test_invalid_arguments_raise_the_composite_error():
    # The argument checks come before the choice: the message is PyTorch's own.
    x = torch.randn(4, 3, 5, 5, device="flagos")
    with pytest.raises(RuntimeError, match="running_mean should contain 3 elements not 5"):
        torch.nn.functional.batch_norm(x, torch.zeros(5, device="flagos"), torch.ones(5, device="flagos"))
    with pytest.raises(RuntimeError, match="running_mean must be defined in evaluation mode"):
        torch.batch_norm(x, None, None, None, None, False, 0.1, 1e-5, True)


def _one_hot(device):
    classes = torch.tensor([[0, 3, 1], [2, 2, 4]]).to(device)
    return [torch.nn.functional.one_hot(classes), torch.nn.functional.one_hot(classes, 7),
            torch.nn.functional.one_hot(classes[:, 1:], -1)]


def test_one_hot_equals_the_native_device(tmp_path):
    native = results_on_native(_one_hot, native_device(), tmp_path)
    classes = torch.tensor([0, 2, 1], device="flagos")
    with flagos_core.trace() as t:
        assert_matches_native(_one_hot(torch.device("flagos")), native)
        torch.nn.functional.one_hot(classes, 3)
    assert ("one_hot", flagos_core.runtime()["name"]) in t.counts  # one call on the native device


@pytest.mark.skipif(native_device().type != "cpu", reason="native CUDA reports bad classes by a device-side assert")
def test_one_hot_checks_classes_as_the_native_device():
    # PyTorch's one_hot checks the class range for CPU tensors and leaves it
    # to the kernel on accelerators. On the host runtime flagos runs it
    # whole on the CPU, so the CPU's messages come.
    for bad, message in [([0, -1], "Class values must be non-negative"),
                         ([0, 3], "Class values must be smaller than num_classes")]:
        for device in ("cpu", "flagos"):
            with pytest.raises(RuntimeError, match=message):
                torch.nn.functional.one_hot(torch.tensor(bad, device=device), 3)


def _self_attention(device):
    # Self-contained: on an accelerator it runs in a side process. The fast
    # path of multi-head attention (eval, no grad) fuses the input
    # projection when query, key and value are one tensor (is_same).
    torch.manual_seed(0)
    results = []
    for embed, heads in ((8, 2), (6, 3), (32, 4)):
        mha = torch.nn.MultiheadAttention(embed, heads, batch_first=True).to(device).eval()
        x = torch.randn(3, 5, embed).to(device)
        with torch.no_grad():
            results += [mha(x, x, x, need_weights=False)[0], mha(x, x.clone(), x.clone(), need_weights=False)[0]]
    layer = torch.nn.TransformerDecoderLayer(16, 2, 32, batch_first=True).to(device).eval()
    memory, target = torch.randn(2, 4, 16).to(device), torch.randn(2, 3, 16).to(device)
    with torch.no_grad():
        results.append(layer(target, memory))
    return results


def test_one_tensor_in_several_arguments_is_one_tensor_natively(tmp_path):
    # flagos gave each argument its own native alias, so kernels that test
    # is_same took their other branch (three projections instead of one).
    native = results_on_native(_self_attention, native_device(), tmp_path)
    assert_matches_native(_self_attention(torch.device("flagos")), native)
    x = torch.randn(2, 3, device="flagos")
    assert torch.equal(torch.mm(x, x.T).cpu(), torch.mm(x.cpu(), x.cpu().T)) and torch.equal((x * x).cpu(), x.cpu() * x.cpu())


def _group_norm_channels_last(device):
    # Self-contained: on an accelerator it runs in a side process. Training:
    # outputs and the gradients of input, weight and bias.
    torch.manual_seed(0)
    norm = torch.nn.GroupNorm(3, 6).to(device)
    x = torch.randn(3, 6, 4, 5).to(memory_format=torch.channels_last).to(device).requires_grad_()
    y = norm(x)
    (y * torch.linspace(-1, 1, y.numel()).view_as(y).to(device)).sum().backward()
    return [y.detach(), x.grad, norm.weight.grad, norm.bias.grad]


def test_group_norm_trains_on_channels_last_input_as_natively(tmp_path):
    # PyTorch's autograd formula makes group norm's backward inputs
    # contiguous in the input's memory format on the CPU only, and plainly
    # contiguous elsewhere (flagos too): on the host runtime the backward's
    # sums run in another order than the CPU's (documented in usage.md).
    native = results_on_native(_group_norm_channels_last, native_device(), tmp_path)
    flagos = _group_norm_channels_last(torch.device("flagos"))
    if native_device().type == "cpu":
        assert torch.equal(flagos[0].cpu(), native[0])
        assert_matches_native(flagos, native, rtol=1e-5, atol=1e-5)
    else:
        assert_matches_native(flagos, native)


def _linear_cross_entropy(device):
    # Self-contained: on an accelerator it runs in a side process.
    from torch.nn import LinearCrossEntropyOptions

    torch.manual_seed(0)
    x0, w0, target = torch.randn(256, 32), torch.randn(512, 32) * 0.1, torch.randint(0, 512, (256,))
    results = []
    for dtype in (torch.bfloat16, torch.float16):
        x = x0.to(dtype).to(device).requires_grad_()
        w = w0.to(dtype).to(device).requires_grad_()
        loss = torch.nn.functional.linear_cross_entropy(x, w, target.to(device), options=LinearCrossEntropyOptions())
        loss.backward()
        results += [loss.detach(), x.grad, w.grad]
    return results


def test_linear_cross_entropy_options_resolve_as_on_the_native_device(tmp_path):
    # Its "auto" options come from tables keyed by device type; flagos got
    # the fallback (bf16 accumulation where the CPU takes fp32).
    pytest.importorskip("torch.nn.modules.linear_cross_entropy_options", reason="torch 2.13+")
    native = results_on_native(_linear_cross_entropy, native_device(), tmp_path)
    assert_matches_native(_linear_cross_entropy(torch.device("flagos")), native)


def _kaiser_windows(device):
    # Self-contained: on an accelerator it runs in a side process.
    return [torch.kaiser_window(6, device=device), torch.kaiser_window(7, False, device=device),
            torch.kaiser_window(8, True, 5.0, dtype=torch.float64, device=device), torch.kaiser_window(1, device=device)]


def test_kaiser_window_runs_the_native_devices_kernel(tmp_path):
    # Its one kernel looks its computation up by device type, which only CPU
    # and CUDA register (codegen/device_stub_ops.txt): it raised an internal
    # assert on flagos.
    native = results_on_native(_kaiser_windows, native_device(), tmp_path)
    assert_matches_native(_kaiser_windows(torch.device("flagos")), native)


def _ldexp_and_conj_physical(device):
    # Self-contained: on an accelerator it runs in a side process.
    x = torch.tensor([0.5, 0.0, 3.0, -1.25], device=device)
    exponents = torch.tensor([128, 200, -150, 3], device=device)
    z = torch.tensor([1 + 1j, 2 - 3j, -0.5j], device=device)
    z_inplace = z.clone()
    z_inplace.conj_physical_()
    out = torch.empty(4, device=device)
    values = torch.empty(0, device=device)
    indices = torch.empty(0, dtype=torch.long, device=device)
    torch.mode(torch.tensor([[1.0, 2, 2], [3, 3, 1]], device=device), 1, out=(values, indices))
    return [torch.ldexp(x, exponents), torch.ldexp(x.double(), exponents), torch.ldexp(x, exponents, out=out),
            x.clone().ldexp_(exponents), z_inplace, torch.conj_physical(z), values, indices]


def test_ldexp_and_conj_physical_run_the_native_devices_kernels(tmp_path):
    # Their kernels for every device look a DispatchStub up by device type:
    # ldexp took x * 2**e on flagos (inf and nan where CPU's and CUDA's give
    # the value), conj_physical_ raised an internal assert. mode's out=
    # form checks the device type ("only supports CPU, CUDA and XPU").
    native = results_on_native(_ldexp_and_conj_physical, native_device(), tmp_path)
    assert_matches_native(_ldexp_and_conj_physical(torch.device("flagos")), native)


def _attention_with_a_learned_mask(device):
    # Self-contained: on an accelerator it runs in a side process. A mask
    # that requires grad, called without grad (a reentrant checkpoint's
    # forward): the choice of kernel reads requires_grad there too.
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 3, 8, device=device) for _ in range(3))
    bias = torch.nn.Parameter(torch.randn(3, 3, device=device))
    with torch.no_grad():
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    return [out]


def test_attention_without_grad_chooses_as_the_native_device_for_a_mask_that_requires_grad(tmp_path):
    native = results_on_native(_attention_with_a_learned_mask, native_device(), tmp_path)
    assert_matches_native(_attention_with_a_learned_mask(torch.device("flagos")), native)


def _transformer_fast_path_under_autocast(device):
    # Self-contained: on an accelerator it runs in a side process. The
    # inference fast path is one native kernel that calls linear and bmm
    # inside: natively autocast casts those, as no autocast lists the kernel.
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True).to(device).eval()
    x = torch.randn(2, 5, 8).to(device)
    with torch.inference_mode(), torch.autocast(device.type, dtype=torch.bfloat16):
        return [layer(x)]


@pytest.mark.skipif(native_device().type != "cpu", reason="native CUDA skips the fast path under its autocast; "
                    "torch checks CUDA's autocast only, so flagos-cuda takes it, uncast")
def test_a_native_kernel_calling_cast_ops_casts_them_under_flagos_autocast(tmp_path):
    native = results_on_native(_transformer_fast_path_under_autocast, native_device(), tmp_path)
    got = _transformer_fast_path_under_autocast(torch.device("flagos"))
    assert got[0].dtype == torch.bfloat16
    assert_matches_native(got, native)


def test_the_native_devices_autocast_casts_nothing_on_flagos():
    # As torch.autocast("cpu") casts no CUDA tensor: around flagos code the
    # native device's autocast changed whole calls (linear, matmul, without
    # autograd), and won over flagos's own where both were on.
    native = native_device().type
    a, w = torch.randn(4, 8, device="flagos"), torch.randn(3, 8, device="flagos")
    with torch.autocast(native, dtype=torch.bfloat16):
        assert F.linear(a, w).dtype == torch.float32 and (a @ w.T).dtype == torch.float32
        with torch.no_grad():
            assert F.linear(a, w.requires_grad_()).dtype == torch.float32
    with torch.autocast(native, dtype=torch.float16), torch.autocast("flagos", dtype=torch.bfloat16):
        assert F.linear(a, w).dtype == torch.bfloat16
