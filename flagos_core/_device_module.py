"""`torch.flagos`: the device module, mirroring `torch.cuda`."""

import torch

from . import _C

_BACKEND = "flagos"


def _index(device=None):
    """Device index from None / int / str / torch.device, checked."""
    if device is None:
        return _C._current_device()
    if isinstance(device, int):
        index = device
    else:
        device = torch.device(device)
        if device.type != _BACKEND:
            raise ValueError(f"expected a flagos device, got {device}")
        index = _C._current_device() if device.index is None else device.index
    count = _C._device_count()
    if not 0 <= index < count:
        raise RuntimeError(f"flagos:{index} is not a valid device: the {_C._runtime_name()} runtime has {count} "
                           f"flagos device(s), flagos:0 to flagos:{count - 1}")
    return index


def is_available():
    return _C._device_count() > 0


def is_initialized():
    return _C._has_runtime()


def _is_in_bad_fork():
    return False


def _lazy_init():
    pass


def init():
    """As torch.cuda.init: the runtime is ready once flagos_core is imported."""


OutOfMemoryError = torch.OutOfMemoryError


def is_bf16_supported(including_emulation=True):
    """Whether bfloat16 tensors compute on flagos: its native device's answer
    (CPU's kernels take bfloat16; a plugin may answer for its device)."""
    return True


def device_count():
    return _C._device_count()


def current_device():
    return _C._current_device()


def _no_device(device):
    # A negative index (a CPU tensor's get_device()) selects nothing, as in
    # torch.cuda.set_device and torch.cuda.device.
    return isinstance(device, int) and device < 0


def set_device(device):
    if not _no_device(device):
        _C._set_device(_index(device))


class device:
    """Context manager that makes `device` current for its block (a negative
    index, or None, changes nothing, as torch.cuda.device)."""

    def __init__(self, device):
        self.index = None if device is None or _no_device(device) else _index(device)
        self.previous = None

    # torch.cuda.device's attribute names, which code written for it reads:
    # the index (-1 for none) and the one current before the block.
    @property
    def idx(self):
        return -1 if self.index is None else self.index

    @property
    def prev_idx(self):
        return -1 if self.previous is None else self.previous

    def __enter__(self):
        if self.index is not None:
            self.previous = _C._current_device()
            _C._set_device(self.index)

    def __exit__(self, *exc):
        if self.index is not None:
            _C._set_device(self.previous)
        return False


class device_of(device):
    """The device of tensor `obj` current for the block (nothing changes for
    a CPU tensor), as torch.cuda.device_of."""

    def __init__(self, obj):
        super().__init__(obj.get_device() if obj.device.type == _BACKEND else -1)


def synchronize(device=None):
    _C._synchronize(_index(device))


def get_device_name(device=None):
    return _C._device_properties(_index(device))[0]


class _DeviceProperties:
    def __init__(self, name, total_memory, major, minor, multi_processor_count):
        self.name = name
        self.total_memory = total_memory
        self.major = major
        self.minor = minor
        self.multi_processor_count = multi_processor_count

    def __repr__(self):
        return (f"_FlagosDeviceProperties(name='{self.name}', total_memory={self.total_memory}, "
                f"major={self.major}, minor={self.minor}, multi_processor_count={self.multi_processor_count})")


def get_device_properties(device=None):
    return _DeviceProperties(*_C._device_properties(_index(device)))


def get_device_capability(device=None):
    props = get_device_properties(device)
    return props.major, props.minor


def get_amp_supported_dtype():
    """What torch.autocast("flagos") may cast to. float16 and bfloat16 where
    the runtime chose a native device's autocast policies
    (flagos_core.use_autocast_policies: the CUDA plugin chooses CUDA's, so
    flagos casts as torch.autocast("cuda") does; the host runtime CPU's);
    otherwise none, and an enabled torch.autocast("flagos") warns that it
    turns itself off rather than run uncast. (torch.autocast asks even when
    made with enabled=False, as model code does to switch autocast off: no
    warning of our own here.)"""
    if _C._autocast_policies():
        return [torch.float16, torch.bfloat16]
    return []


# Streams and events are torch's generic ones on the flagos device. These
# build plain torch.Stream / torch.Event objects (not subclasses: torch's
# methods such as Event.elapsed_time accept only the exact types).
class _OnFlagos(type):
    # isinstance(s, torch.flagos.Stream) holds for flagos streams (and
    # events), as isinstance(s, torch.cuda.Stream) for CUDA's.
    def __instancecheck__(cls, obj):
        return isinstance(obj, cls.native_type) and torch.device(obj.device).type == _BACKEND


class Stream(metaclass=_OnFlagos):
    native_type = torch.Stream

    def __new__(cls, device=None, priority=0, **kwargs):
        if "stream_id" in kwargs:
            return torch.Stream(**kwargs)
        return torch.Stream(device=torch.device(_BACKEND, _index(device)), priority=priority)


class Event(metaclass=_OnFlagos):
    native_type = torch.Event

    def __new__(cls, enable_timing=False, blocking=False, interprocess=False):
        return torch.Event(device=torch.device(_BACKEND, _C._current_device()), enable_timing=enable_timing,
                           blocking=blocking, interprocess=interprocess)


def current_stream(device=None):
    return torch.accelerator.current_stream(torch.device(_BACKEND, _index(device)))


def default_stream(device=None):
    """The device's default stream (id 0, as CUDA's)."""
    index = _index(device)
    return torch.Stream(stream_id=0, device_index=index, device_type=current_stream(index).device_type)


def set_stream(stream):
    torch.accelerator.set_stream(stream)


class StreamContext:
    """torch.cuda.StreamContext's counterpart, which `stream(s)` returns:
    makes `s` current (and its device, as torch.cuda.stream does) for the
    block; the caller's device and its stream come back afterwards. None
    changes nothing."""

    def __init__(self, stream):
        self.stream = stream
        self._saved = []  # per entry: (device, [its stream, the stream's device's stream])

    def __enter__(self):
        s = self.stream
        if s is None:
            return None
        previous_device = _C._current_device()
        self._saved.append((previous_device, [current_stream(previous_device), current_stream(s.device)]))
        torch.accelerator.set_stream(s)
        return s

    def __exit__(self, *exc):
        if self.stream is None:
            return
        previous_device, previous_streams = self._saved.pop()
        for previous in reversed(previous_streams):
            torch.accelerator.set_stream(previous)
        _C._set_device(previous_device)


def stream(s):
    """A StreamContext for `s`, as torch.cuda.stream."""
    return StreamContext(s)


# Random numbers: one default generator per device.
def _generator(device=None):
    return _C._default_generator(_index(device))


def _get_generator(device):
    """The default generator of `device` (torch.cuda's private helper, which
    torch's compile stack asks device modules for)."""
    return _generator(device)


def manual_seed(seed):
    _generator().manual_seed(int(seed))


def manual_seed_all(seed):
    for i in range(device_count()):
        _generator(i).manual_seed(int(seed))


def seed():
    _generator().seed()


def seed_all():
    for i in range(device_count()):
        _generator(i).seed()


def initial_seed():
    return _generator().initial_seed()


def get_rng_state(device=None):
    return _generator(device).get_state()


def set_rng_state(new_state, device=None):
    _generator(device).set_state(new_state)


def get_rng_state_all():
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(new_states):
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


# Memory: statistics of the runtime's allocator, per device.
def memory_stats(device=None):
    return dict(sorted(_C._memory_stats(_index(device)).items()))


def memory_allocated(device=None):
    return memory_stats(device)["allocated_bytes.all.current"]


def max_memory_allocated(device=None):
    return memory_stats(device)["allocated_bytes.all.peak"]


def memory_reserved(device=None):
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device=None):
    return memory_stats(device)["reserved_bytes.all.peak"]


def reset_peak_memory_stats(device=None):
    _C._reset_peak_memory_stats(_index(device))


def reset_accumulated_memory_stats(device=None):
    _C._reset_accumulated_memory_stats(_index(device))


def empty_cache():
    _C._empty_cache()


def memory_stats_as_nested_dict(device=None):
    """memory_stats as nested dicts, as torch.cuda's: "a.b.c" is [a][b][c]."""
    nested = {}
    for key, value in memory_stats(device).items():
        *path, last = key.split(".")
        level = nested
        for part in path:
            level = level.setdefault(part, {})
        level[last] = value
    return nested


# torch.cuda's deprecated names, which code written for CUDA still calls.
def reset_max_memory_allocated(device=None):
    reset_peak_memory_stats(device)


def memory_cached(device=None):
    return memory_reserved(device)


def max_memory_cached(device=None):
    return max_memory_reserved(device)


def reset_max_memory_cached(device=None):
    reset_peak_memory_stats(device)


def ipc_collect():
    """Frees memory other processes no longer use (torch.cuda.ipc_collect).
    The host runtime's shared memory is the host's own, freed with its last
    tensor: nothing to collect. A plugin whose runtime shares memory through
    its native device replaces this."""


def memory_summary(device=None, abbreviated=False):
    """The allocator's statistics for `device` as a printable table."""
    from ._memory_summary import format_summary

    index = _index(device)
    return format_summary(memory_stats(index), f"flagos:{index} memory ({_C._runtime_name()} runtime)", abbreviated)


def mem_get_info(device=None):
    """(free, total) bytes of the device's memory."""
    return tuple(_C._mem_get_info(_index(device)))


def __getattr__(name):
    # Activation checkpointing stashes and restores a device's RNG state only
    # where its module's `_initialized` is true (torch.cuda's lazy-init flag);
    # read live, like is_initialized().
    if name == "_initialized":
        return is_initialized()
    if name == "default_generators":  # as torch.cuda's: one per device, made once by the runtime
        return tuple(_generator(i) for i in range(device_count()))
    # Otherwise looked up by torch.compile's inductor only: see _inductor.py.
    from . import _inductor

    if name in _inductor.CODEGEN_NAMES:
        return _inductor.codegen_attribute()
    raise AttributeError(f"module 'torch.flagos' has no attribute '{name}'")


def __dir__():
    return sorted(set(globals()) | {"default_generators"})
