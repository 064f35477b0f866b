"""Serialization, conversions, pinned memory, streams and events, torch.accelerator,
device properties, and a short training run that must match the native device
(CPU on the host runtime) bitwise."""

import copy
import gc
import io
import os
import time

import pytest
import torch

import flagos_core
from native_reference import results_on_native

FLAGOS0 = torch.device("flagos", 0)


def _roundtrip(obj, **load_kwargs):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kwargs)


def _mlp():
    return torch.nn.Sequential(
        torch.nn.Linear(12, 32), torch.nn.ReLU(),
        torch.nn.Linear(32, 32), torch.nn.ReLU(),
        torch.nn.Linear(32, 3),
    )


# ---------------------------------------------------------------- serialization

def test_save_load_flagos_tensor_default_location():
    torch.manual_seed(0)
    ref = torch.randn(5, 7)
    x = ref.to("flagos")
    y = _roundtrip(x)
    assert y.device == FLAGOS0
    assert torch.equal(y.cpu(), ref)
    # With weights_only (the default of torch.load) spelled out.
    z = _roundtrip(x, weights_only=True)
    assert z.device == FLAGOS0 and torch.equal(z.cpu(), ref)


def test_load_flagos_saved_to_cpu():
    ref = torch.arange(12.0).reshape(3, 4)
    for location in ("cpu", torch.device("cpu"), {"flagos:0": "cpu"}):
        y = _roundtrip(ref.to("flagos"), map_location=location)
        assert y.device == torch.device("cpu"), location
        assert torch.equal(y, ref)


def test_load_cpu_saved_to_flagos():
    ref = torch.randn(4, 4, dtype=torch.float64)
    for location in ("flagos", "flagos:0", FLAGOS0, {"cpu": "flagos:0"}):
        y = _roundtrip(ref, map_location=location)
        assert y.device == FLAGOS0, location
        assert y.dtype == torch.float64
        assert torch.equal(y.cpu(), ref)


def test_saved_views_keep_sharing_storage():
    base = torch.zeros(4, 4, device="flagos")
    loaded = _roundtrip({"base": base, "row": base[1], "col": base[:, 2]})
    loaded["row"].fill_(3.0)
    loaded["col"].fill_(5.0)
    expected = torch.zeros(4, 4)
    expected[1] = 3.0
    expected[:, 2] = 5.0
    assert torch.equal(loaded["base"].cpu(), expected)


def test_state_dict_roundtrips():
    torch.manual_seed(1)
    cpu_model = _mlp()
    model = copy.deepcopy(cpu_model).to("flagos")
    sd = _roundtrip(model.state_dict())
    assert all(v.device == FLAGOS0 for v in sd.values())
    fresh = _mlp().to("flagos")
    fresh.load_state_dict(sd)
    for (name, p), q in zip(cpu_model.named_parameters(), fresh.parameters()):
        assert q.device == FLAGOS0 and torch.equal(q.cpu(), p), name

    sd_cpu = _roundtrip(model.state_dict(), map_location="cpu")
    assert all(v.device.type == "cpu" for v in sd_cpu.values())
    for name, p in cpu_model.state_dict().items():
        assert torch.equal(sd_cpu[name], p), name

    sd_flagos = _roundtrip(cpu_model.state_dict(), map_location="flagos")
    assert all(v.device == FLAGOS0 for v in sd_flagos.values())
    x = torch.randn(6, 12)
    reloaded = _mlp()
    reloaded.load_state_dict(sd_flagos)  # copies flagos values into CPU parameters
    assert torch.equal(reloaded(x), cpu_model(x))


# ------------------------------------------------------------------ conversions

def test_to_and_flagos_methods():
    ref = torch.randn(3, 5)
    for moved in (ref.to("flagos"), ref.flagos(), ref.flagos(0), ref.to(FLAGOS0)):
        assert moved.device == FLAGOS0 and moved.is_flagos
        assert torch.equal(moved.cpu(), ref)
    assert not ref.is_flagos
    on = ref.to("flagos")
    assert on.flagos() is on and on.to("flagos") is on
    h = ref.to("flagos", torch.float16)
    assert h.dtype == torch.float16 and torch.equal(h.cpu(), ref.half())


def test_moving_a_module_keeps_its_parameters_and_leaves_torch_defaults_alone():
    # Module.to keeps each Parameter object through `param.data = ...`, as
    # between CPU and CUDA: tied weights stay tied, and an optimizer made
    # before the move steps the moved parameters. flagos used to turn on
    # torch's swap-on-conversion for the whole process instead, which broke
    # load_state_dict for modules whose parameters have weak references
    # (every RNN), on any device.
    assert not torch.__future__.get_swap_module_params_on_conversion()
    m = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    m[1].weight = m[0].weight
    params = list(m.parameters())
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    m(torch.tensor([1, 2])).sum().backward()
    m.to("flagos")
    assert list(m.parameters()) == params and m[1].weight is m[0].weight
    assert all(p.device == FLAGOS0 and p.grad.device == FLAGOS0 for p in params)
    before = params[0].detach().cpu()
    opt.step()
    assert not torch.equal(params[0].cpu(), before)
    m.to("cpu")
    assert all(p.device.type == "cpu" for p in params)

    lstm, copied = torch.nn.LSTM(8, 16), torch.nn.LSTM(8, 16)
    copied.load_state_dict(lstm.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(lstm.parameters(), copied.parameters()))
    weight = copied.weight_ih_l0
    copied.to("flagos")
    assert copied.weight_ih_l0 is weight and weight.device == FLAGOS0


@pytest.mark.native
def test_module_flagos_moves_parameters_and_buffers(native_device):
    torch.manual_seed(2)
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    ref = copy.deepcopy(m)
    assert m.flagos() is m
    for t in list(m.parameters()) + list(m.buffers()):
        assert t.device == FLAGOS0
    for a, b in zip(ref.state_dict().values(), m.state_dict().values()):
        assert torch.equal(a, b.cpu())
    m.eval(), ref.eval()
    x = torch.randn(5, 4)
    # batch_norm takes the native device's kernel on flagos too (NativeChoices.cpp).
    assert torch.equal(m(x.flagos()).cpu(), ref.to(native_device)(x.to(native_device)).cpu())


def test_storage_flagos():
    ref = torch.arange(8, dtype=torch.int32)
    s = ref.untyped_storage().flagos()
    assert s.device == FLAGOS0
    assert s.nbytes() == ref.nbytes
    t = torch.empty(0, dtype=torch.int32, device="flagos").set_(s)
    assert torch.equal(t.cpu(), ref)
    assert s.cpu().device.type == "cpu"
    assert torch.equal(torch.empty(0, dtype=torch.int32).set_(s.cpu()), ref)


# --------------------------------------------------------------- pinned memory

def test_pin_memory():
    ref = torch.randn(64)
    assert not ref.is_pinned()
    pinned = ref.pin_memory()
    assert pinned.device.type == "cpu"
    assert pinned.is_pinned()
    assert torch.equal(pinned, ref)
    assert pinned.data_ptr() != ref.data_ptr()
    assert pinned.pin_memory() is pinned
    assert torch.empty(10, pin_memory=True).is_pinned()
    on = pinned.to("flagos", non_blocking=True)
    torch.flagos.synchronize()
    assert torch.equal(on.cpu(), ref)
    back = torch.empty(64).pin_memory()
    back.copy_(on, non_blocking=True)
    torch.flagos.synchronize()
    assert torch.equal(back, ref)


def test_device_factories_refuse_pinned_memory_as_native_devices_do():
    # CUDA's factories raise; flagos's ignored the flag.
    for make in (lambda: torch.empty(2, device="flagos", pin_memory=True),
                 lambda: torch.zeros(2, 3, device="flagos", pin_memory=True),
                 lambda: torch.empty_strided((2,), (1,), device="flagos", pin_memory=True)):
        with pytest.raises(RuntimeError, match="Only dense CPU tensors can be pinned"):
            make()
    assert torch.empty(2, device="flagos", pin_memory=False).device.type == "flagos"


# ------------------------------------------------------------ streams / events

def test_stream_context_sets_and_restores_current_stream():
    default = torch.flagos.current_stream()
    assert default.device == FLAGOS0
    s = torch.flagos.Stream()
    assert isinstance(s, torch.Stream)
    assert s.device == FLAGOS0 and s != default
    with torch.flagos.stream(s) as entered:
        assert entered is s
        assert torch.flagos.current_stream() == s
        assert torch.accelerator.current_stream() == s
        x = torch.ones(100, device="flagos") * 3
    assert torch.flagos.current_stream() == default
    s.synchronize()
    assert s.query()
    assert torch.equal(x.cpu(), torch.full((100,), 3.0))
    # Restored even when the block raises.
    with pytest.raises(KeyError):
        with torch.flagos.stream(s):
            raise KeyError("x")
    assert torch.flagos.current_stream() == default
    # torch.Stream's own context manager agrees.
    with s:
        assert torch.flagos.current_stream() == s
    assert torch.flagos.current_stream() == default


def test_stream_returns_a_stream_context_as_torch_cuda_stream_does():
    default = torch.flagos.current_stream()
    s = torch.flagos.Stream()
    context = torch.flagos.stream(s)
    assert isinstance(context, torch.flagos.StreamContext)
    # Entered by hand, as code written for torch.cuda.stream may: the stream
    # stays current until the context is left, even once nothing holds it.
    context.__enter__()
    del context
    gc.collect()
    try:
        assert torch.flagos.current_stream() == s
    finally:
        torch.flagos.set_stream(default)
    # One context entered twice, nested: each exit restores its own entry's.
    context = torch.flagos.StreamContext(s)
    with context:
        with torch.flagos.stream(torch.flagos.Stream()):
            with context:
                assert torch.flagos.current_stream() == s
            assert torch.flagos.current_stream() != s
        assert torch.flagos.current_stream() == s
    assert torch.flagos.current_stream() == default
    with torch.flagos.stream(None) as entered:
        assert entered is None and torch.flagos.current_stream() == default


def test_torch_cuda_memory_names_code_still_calls():
    x = torch.empty(1 << 20, dtype=torch.uint8, device="flagos")
    stats = torch.flagos.memory_stats()
    nested = torch.flagos.memory_stats_as_nested_dict()
    assert nested["allocated_bytes"]["all"]["current"] == stats["allocated_bytes.all.current"]
    assert nested["num_ooms"] == stats["num_ooms"]
    assert torch.flagos.memory_cached() == torch.flagos.memory_reserved()
    assert torch.flagos.max_memory_cached() == torch.flagos.max_memory_reserved()
    del x
    torch.flagos.reset_max_memory_allocated()
    assert torch.flagos.max_memory_allocated() == torch.flagos.memory_allocated()
    torch.flagos.reset_max_memory_cached()
    assert torch.flagos.max_memory_reserved() == torch.flagos.memory_reserved()
    torch.flagos.ipc_collect()
    assert "default_generators" in dir(torch.flagos)


def test_default_stream_and_cuda_style_helpers():
    default = torch.flagos.default_stream()
    assert default == torch.flagos.current_stream() and default.stream_id == 0
    with torch.flagos.stream(torch.flagos.Stream()):
        assert torch.flagos.current_stream() != torch.flagos.default_stream(0)
    with pytest.raises(RuntimeError, match="is not a valid device"):
        torch.flagos.default_stream(torch.flagos.device_count())
    if hasattr(torch.Stream, "native_handle") and flagos_core.runtime()["name"] == "host":
        # The native device's answer: CPU streams have none (CUDA's: tests/test_cuda_plugin.py).
        with pytest.raises(RuntimeError, match="native handle"):
            torch.flagos.current_stream().native_handle  # noqa: B018
        with pytest.raises(RuntimeError, match="native handle"):
            torch.Stream(device="cpu").native_handle  # noqa: B018
    torch.flagos.init()
    assert torch.flagos.is_bf16_supported()
    x = torch.randn(8, dtype=torch.bfloat16)
    assert torch.equal((x.to("flagos") * 3).cpu(), x * 3)


def test_flagos_streams_and_events_are_instances_of_the_flagos_types():
    # As isinstance(s, torch.cuda.Stream) holds for CUDA's streams.
    stream, event = torch.flagos.Stream(), torch.flagos.Event()
    assert isinstance(stream, torch.flagos.Stream) and isinstance(torch.flagos.current_stream(), torch.flagos.Stream)
    assert isinstance(event, torch.flagos.Event) and not isinstance(event, torch.flagos.Stream)
    assert not isinstance(stream, torch.flagos.Event) and not isinstance(torch.ones(1), torch.flagos.Stream)
    assert type(stream) is torch.Stream  # torch's own type, which its methods take


def test_stream_synchronization_calls():
    s = torch.flagos.Stream()
    default = torch.flagos.current_stream()
    e = torch.flagos.Event()
    e.record(s)
    s.wait_stream(default)
    default.wait_stream(s)
    e.wait(default)
    s.wait_event(e)
    e.synchronize()
    assert e.query() and s.query() and default.query()


def test_record_stream_takes_flagos_streams_and_names_a_wrong_one():
    # The core serves record_stream (the runtime's allocator tracks the
    # allocation; the GPU test checks the memory is kept from reuse).
    assert flagos_core.route("record_stream") == "core"
    x = torch.ones(64, device="flagos")
    s = torch.flagos.Stream()
    x.record_stream(s)
    x[8:16].record_stream(torch.flagos.current_stream())
    torch.empty(0, device="flagos").record_stream(s)
    with pytest.raises(RuntimeError, match="needs a flagos stream"):
        x.record_stream(torch.Stream(device="cpu"))
    assert torch.equal(x.cpu(), torch.ones(64))


def _timed_work():
    a = torch.randn(256, 256, device="flagos")
    for _ in range(10):
        a = torch.tanh(a @ a)
    return a


def test_event_record_query_synchronize():
    e = torch.flagos.Event()
    assert e.query(), "an event never recorded counts as complete"
    e.record()
    out = _timed_work()
    e2 = torch.flagos.Event(enable_timing=True)
    e2.record()
    e2.synchronize()
    assert e.query() and e2.query()
    e.synchronize()
    assert out.device == FLAGOS0


def test_event_elapsed_time():
    # torch's C methods accept only exact torch.Event objects as the other event.
    start = torch.flagos.Event(enable_timing=True)
    end = torch.flagos.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    _timed_work()
    end.record()
    end.synchronize()
    wall_ms = (time.perf_counter() - t0) * 1000
    ms = start.elapsed_time(end)
    assert isinstance(ms, float)
    assert 0.0 <= ms <= wall_ms + 1.0, (ms, wall_ms)


def test_stream_record_event_with_flagos_event():
    # torch's C Stream.record_event accepts only an exact torch.Event.
    s = torch.flagos.Stream()
    e = torch.flagos.Event()
    returned = s.record_event(e)
    e.synchronize()
    assert e.query()
    assert returned is e


def test_generic_torch_event_timing_on_flagos():
    # Plain torch.Event objects on the flagos device.
    start = torch.Event(device="flagos", enable_timing=True)
    end = torch.Event(device="flagos", enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    _timed_work()
    end.record()
    end.synchronize()
    wall_ms = (time.perf_counter() - t0) * 1000
    assert 0.0 <= start.elapsed_time(end) <= wall_ms + 1.0
    untimed = torch.Event(device="flagos"), torch.Event(device="flagos")
    for e in untimed:
        e.record()
    with pytest.raises((RuntimeError, ValueError), match="enable_timing"):
        untimed[0].elapsed_time(untimed[1])


# ------------------------------------------------------ torch.accelerator, props

def test_torch_accelerator():
    acc = torch.accelerator.current_accelerator()
    assert acc is not None and acc.type == "flagos"
    assert torch.accelerator.is_available()
    assert torch.accelerator.device_count() == torch.flagos.device_count() >= 1
    assert torch.accelerator.current_device_index() == torch.flagos.current_device()
    x = torch.randn(100, device="flagos")
    y = x * 2
    torch.accelerator.synchronize()
    torch.accelerator.synchronize(0)
    torch.flagos.synchronize()
    assert torch.equal(y.cpu(), x.cpu() * 2)
    assert torch.get_device_module("flagos") is torch.flagos
    # A device that does not exist is refused, as by torch.flagos.
    missing = torch.flagos.device_count()
    for call in (torch.accelerator.synchronize, torch.accelerator.get_memory_info, torch.flagos.synchronize):
        with pytest.raises(RuntimeError, match=f"flagos:{missing} is not a valid device"):
            call(missing)
        with pytest.raises(RuntimeError, match=f"flagos:{missing} is not a valid device"):
            call(f"flagos:{missing}")


def test_device_name_and_properties():
    name = torch.flagos.get_device_name()
    assert isinstance(name, str) and name
    assert torch.flagos.get_device_name(0) == name
    props = torch.flagos.get_device_properties()
    assert props.name == name
    assert isinstance(props.total_memory, int) and props.total_memory >= 0
    assert isinstance(props.major, int) and isinstance(props.minor, int)
    assert props.multi_processor_count >= 1
    assert torch.flagos.get_device_properties("flagos:0").name == name
    assert torch.flagos.get_device_capability() == (props.major, props.minor)
    # Both runtimes have a native device's autocast policies (CUDA's, CPU's; test_autocast.py).
    assert torch.flagos.get_amp_supported_dtype() == [torch.float16, torch.bfloat16]
    with pytest.raises(RuntimeError, match="flagos:7"):
        torch.flagos.get_device_properties(7)


def test_device_properties_report_total_memory():
    total = torch.flagos.get_device_properties().total_memory
    assert total > 0
    if flagos_core.runtime()["name"] == "host":
        assert total <= os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


# ------------------------------------------------------------------ training

def _mlp_training(device, opt_name):
    # Self-contained: on an accelerator it also runs in a side process.
    torch.manual_seed(10)
    model = torch.nn.Sequential(
        torch.nn.Linear(12, 32), torch.nn.ReLU(),
        torch.nn.Linear(32, 32), torch.nn.ReLU(),
        torch.nn.Linear(32, 3),
    ).to(device)
    if opt_name == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    g = torch.Generator().manual_seed(11)
    losses = []
    for _ in range(6):
        x = torch.randn(16, 12, generator=g).to(device)
        y = torch.randint(0, 3, (16,), generator=g).to(device)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    state = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.dim() > 0]
    # The losses, then the parameters, then the optimizer's state tensors.
    return [torch.tensor(losses, dtype=torch.float64), *(p.detach() for p in model.parameters()), *state]


@pytest.mark.native
@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
def test_mlp_training_matches_the_native_device_bitwise(opt_name, native_device, tmp_path):
    native = results_on_native(_mlp_training, native_device, tmp_path, opt_name=opt_name)
    with flagos_core.trace() as t:
        flagos = _mlp_training(torch.device("flagos"), opt_name)
    assert len(flagos) == len(native) > 6
    for got, want in zip(flagos, native):
        assert torch.equal(got.cpu(), want)
    assert all(v.device == FLAGOS0 for v in flagos[1:])
    assert t.counts, "trace saw no flagos op"
    assert t.fallbacks == []
    assert all(provider != "cpu_fallback" for (_, provider) in t.counts)


def test_legacy_tensor_types_as_torch_cuda_has_them():
    # Tensor.type() names them; ported code tests and builds tensors with them.
    x = torch.ones(2, 3, device="flagos")
    assert x.type() == "torch.flagos.FloatTensor"
    assert f"{torch.flagos.FloatTensor.__module__}.{torch.flagos.FloatTensor.__qualname__}" == x.type()
    assert repr(torch.flagos.FloatTensor) == "<class 'torch.flagos.FloatTensor'>"
    # Conversions given the type itself, as with torch.cuda's types.
    converted = torch.ones(2).type(torch.flagos.DoubleTensor)
    assert converted.device.type == "flagos" and converted.dtype == torch.float64
    module = torch.nn.Linear(2, 2).type(torch.flagos.HalfTensor)
    assert module.weight.device.type == "flagos" and module.weight.dtype == torch.float16
    assert isinstance(x, torch.flagos.FloatTensor) and not isinstance(x, torch.flagos.LongTensor)
    assert not isinstance(torch.ones(2), torch.flagos.FloatTensor)  # a CPU tensor
    assert isinstance(x.long(), torch.flagos.LongTensor) and isinstance(x.bool(), torch.flagos.BoolTensor)
    made = [torch.flagos.LongTensor(3), torch.flagos.FloatTensor(torch.Size([2, 2])), torch.flagos.HalfTensor()]
    assert [(t.shape, t.dtype, t.device.type) for t in made] == [
        ((3,), torch.int64, "flagos"), ((2, 2), torch.float32, "flagos"), ((0,), torch.float16, "flagos")]
    data = torch.flagos.DoubleTensor([[1, 2], [3, 4]])
    assert data.dtype == torch.float64 and torch.equal(data.cpu(), torch.tensor([[1.0, 2], [3, 4]], dtype=torch.float64))
    assert torch.flagos.FloatTensor(x) is x
    with pytest.raises(TypeError, match=r"takes a tensor of that type, got torch.flagos.LongTensor"):
        torch.flagos.FloatTensor(x.long())
    with pytest.raises(RuntimeError, match="makes flagos tensors, not tensors on cpu"):
        torch.flagos.FloatTensor(2, device="cpu")


def test_a_library_op_that_writes_a_saved_tensor_is_caught_at_backward():
    # An operator defined outside ATen has no ADInplaceOrView kernel: its
    # kernel's own writes move the tensor's version natively. On flagos they
    # moved the native alias's, and backward ran on the changed tensor.
    library = torch.library.Library("flagos_test_writes", "DEF")
    try:
        library.define("double_(Tensor(a!) x) -> Tensor(a!)")
        library.impl("double_", lambda t: t.mul_(2), "CPU")
        for device in ("cpu", "flagos"):
            w = torch.ones(3, device=device, requires_grad=True)
            a = w * 1
            y = (a * a).sum()
            before = a._version
            with torch.no_grad():
                torch.ops.flagos_test_writes.double_(a)
            assert a._version == before + 1, device
            with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                y.backward()
    finally:
        library._destroy()
