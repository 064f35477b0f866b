"""Sweep PyTorch's OpInfo database, comparing flagos with its native device bit for bit.

Used by tests/test_opinfo_sweep.py; it can also be run on its own:

    python tests/opinfo_sweep.py [--native cpu|cuda] [--samples N] [--ops name,name] [--timing]

The native device is the reference flagos is held to: "cpu" on the host
runtime, the runtime's own device ("cuda") on an accelerator runtime, whose
plugin runs that device's kernels on flagos tensors (native_device() picks it;
FLAGOS_SWEEP_NATIVE overrides the choice).

For every OpInfo and every dtype of DTYPES that the op supports on the native
device, the first few sample inputs are made on the native device and run
there, then on flagos (inputs copied with the same storage layout, views and
aliasing), and the results, plus the inputs after the call (ops may mutate
them), are compared exactly on CPU (NaN equals NaN). Each side runs right
after the same torch.manual_seed, so random ops (whose flagos generator
reproduces the native device's numbers) are compared exactly too. A sample
whose native run raises is skipped: that is not a flagos failure. Sparse
inputs and outputs are not compared: flagos tensors are strided.

On an accelerator, a few kernels are nondeterministic (atomics). There the
sweep turns on torch.use_deterministic_algorithms (warn_only) for both sides
and runs the native side twice: a pair where the native device disagrees with
itself is set aside and reported, counted neither as a pass nor a failure.
Forward only: samples do not require grad.
"""

import itertools
import math
import os
import sys
import time
import types
import unittest
import warnings
from dataclasses import dataclass, field

import torch

import flagos_core

DEVICE = "flagos"
DTYPES = (torch.float32, torch.bfloat16, torch.int64, torch.bool)
SAMPLES_PER_PAIR = 3
NATIVE_ENV = "FLAGOS_SWEEP_NATIVE"

# Ops that return uninitialized memory: only dtype, shape and device are compared.
UNINITIALIZED_OPS = frozenset({
    "empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided",
    "empty_permuted",
})


def native_device():
    """The device flagos is compared with: the active runtime's ("cpu" for host).

    FLAGOS_SWEEP_NATIVE=<device> overrides it, e.g. to run the accelerator
    settings against CPU on a machine without one.
    """
    forced = os.environ.get(NATIVE_ENV)
    if forced:
        return forced
    name = flagos_core.runtime()["name"]
    return "cpu" if name == "host" else name


def accelerator_options(jobs=None):
    """sweep_isolated() settings for an accelerator's native device.

    Deterministic algorithms on both sides (CUDA's atomics-based kernels, such
    as index_add and scatter_add, otherwise differ from run to run), the native
    side run twice to set aside whatever is nondeterministic still, and pairs
    spread over several worker processes.
    """
    if jobs is None:
        jobs = max(1, min(8, (os.cpu_count() or 1) // 2))
    return {"native_runs": 2, "deterministic": True, "jobs": jobs}


def load_op_db():
    """Import OpInfo's op_db without side effects on the rest of the session.

    torch.testing._internal.common_utils needs `expecttest` (only for its
    TestCase base class) and freezes torch.backends flags at import; a stand-in
    module is used when expecttest is not installed, and the flags are thawed
    again afterwards.
    """
    try:
        import expecttest  # noqa: F401
    except ImportError:
        stub = types.ModuleType("expecttest")

        class TestCase(unittest.TestCase):
            pass

        stub.TestCase = TestCase
        stub.ACCEPT = False
        sys.modules["expecttest"] = stub
    import torch.backends as backends

    flag = "__allow_nonbracketed_mutation_flag"
    saved = backends.__dict__.get(flag, True)
    try:
        from torch.testing._internal.common_methods_invocations import op_db
    finally:
        backends.__dict__[flag] = saved
    return op_db


def full_name(op):
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


def _short(dtype):
    return str(dtype).replace("torch.", "")


# ---------------------------------------------------------------------------
# Copying sample inputs from the native device, and comparing results.


def _device_type(obj):
    """The device type of a torch.device or a device string, else None."""
    if isinstance(obj, torch.device):
        return obj.type
    if isinstance(obj, str):
        try:
            return torch.device(obj).type
        except (RuntimeError, ValueError):
            return None
    return None


class _Copier:
    """Copies the tensors on the native device to `target`, keeping storage,
    offset, sizes and strides; devices and device strings naming the native
    device are mapped to `target` as well.

    Tensors that share a native storage share one target storage too, so
    views, overlapping (expanded) inputs and aliasing between arguments carry
    over. Tensors on other devices (CPU arguments of a CUDA op) stay as they
    are. The bytes travel through CPU: that works between any two devices.
    With target == native, it makes an independent copy for a second run.
    """

    def __init__(self, native, target):
        self.native = torch.device(native).type
        self.target = torch.device(target).type
        self.storages = {}

    def _target_device(self, device):
        if self.target == self.native:
            return device
        return torch.device(self.target) if device.index is None else torch.device(self.target, device.index)

    def storage_for(self, t):
        s = t.untyped_storage()
        key = (str(s.device), s.data_ptr(), s.nbytes())
        if key not in self.storages:
            raw = torch.empty(0, dtype=torch.uint8, device=s.device).set_(s)
            if self.target == self.native:
                copy = raw.clone()
            else:
                copy = raw.cpu().to(self._target_device(t.device))
            self.storages[key] = copy.untyped_storage()
        return self.storages[key]

    def tensor(self, t):
        if t.device.type != self.native:
            return t
        plain = (t.layout == torch.strided and not t.is_quantized and not t.is_conj()
                 and not t.is_neg() and type(t) is torch.Tensor and t.untyped_storage().data_ptr() != 0)
        if plain:
            out = torch.empty(0, dtype=t.dtype, device=self._target_device(t.device))
            out.set_(self.storage_for(t), t.storage_offset(), t.size(), t.stride())
        elif self.target == self.native:
            out = t.clone()
        else:
            out = t.to(self._target_device(t.device))
        if t.requires_grad:
            out.requires_grad_()
        return out

    def __call__(self, obj):
        if isinstance(obj, torch.Tensor):
            return self.tensor(obj)
        if isinstance(obj, torch.device):
            return self._target_device(obj) if obj.type == self.native else obj
        if isinstance(obj, str) and _device_type(obj) == self.native:
            return str(self._target_device(torch.device(obj)))
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):
            return type(obj)(*(self(o) for o in obj))
        if isinstance(obj, (list, tuple)):
            return type(obj)(self(o) for o in obj)
        if isinstance(obj, dict):
            return {k: self(v) for k, v in obj.items()}
        return obj


class Mismatch(AssertionError):
    pass


class _Comparer:
    """Checks a run on `target` against the native run: the same structure,
    values, NaNs, dtypes, shapes and layouts, with whatever the native run put
    on the native device on `target` instead."""

    def __init__(self, native, target):
        self.native = torch.device(native).type
        self.target = torch.device(target).type

    def want_type(self, device_type):
        return self.target if device_type == self.native else device_type

    def tensors_equal(self, expected, actual, where, values=True):
        if not isinstance(actual, torch.Tensor):
            raise Mismatch(f"{where}: expected a tensor, got {type(actual).__name__}")
        want = self.want_type(expected.device.type)
        if actual.device.type != want:
            raise Mismatch(f"{where}: result is on {actual.device}, expected {want}")
        if actual.dtype != expected.dtype:
            raise Mismatch(f"{where}: dtype {actual.dtype} != {expected.dtype}")
        if actual.shape != expected.shape:
            raise Mismatch(f"{where}: shape {tuple(actual.shape)} != {tuple(expected.shape)}")
        if actual.layout != expected.layout:
            raise Mismatch(f"{where}: layout {actual.layout} != {expected.layout}")
        if not values:
            return
        a = actual.detach().cpu()
        e = expected.detach().cpu()
        if e.layout != torch.strided:
            a, e = a.to_dense(), e.to_dense()
        try:
            torch.testing.assert_close(a, e, rtol=0, atol=0, equal_nan=True,
                                       check_device=False, check_stride=False)
        except AssertionError as err:
            lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
            raise Mismatch(f"{where}: values differ: " + " ".join(lines[:3])) from None

    def compare(self, expected, actual, where="output", values=True):
        """Raise Mismatch unless actual (the run on target) equals expected (the native run)."""
        if isinstance(expected, torch.Tensor):
            return self.tensors_equal(expected, actual, where, values)
        if isinstance(expected, (list, tuple)) and not isinstance(expected, torch.Size):
            if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
                raise Mismatch(f"{where}: expected a sequence of {len(expected)}, got {type(actual).__name__}")
            for i, (e, a) in enumerate(zip(expected, actual)):
                self.compare(e, a, f"{where}[{i}]", values)
            return
        if isinstance(expected, dict):
            if not isinstance(actual, dict) or actual.keys() != expected.keys():
                raise Mismatch(f"{where}: dict keys differ")
            for k in expected:
                self.compare(expected[k], actual[k], f"{where}[{k!r}]", values)
            return
        if isinstance(expected, torch.device):
            want = self.want_type(expected.type)
            if torch.device(actual).type != want:
                raise Mismatch(f"{where}: device {actual} != {want}")
            return
        if (isinstance(expected, str) and isinstance(actual, str) and _device_type(expected) == self.native
                and _device_type(actual) == self.target):
            return
        if isinstance(expected, float) and isinstance(actual, float):
            if math.isnan(expected) and math.isnan(actual):
                return
        if not values and isinstance(expected, (int, float, complex)):
            return
        if type(actual) is not type(expected) or actual != expected:
            raise Mismatch(f"{where}: {actual!r} != {expected!r}")

    def compare_inputs(self, native_side, other_side, values):
        """Inputs after the call: an op may write into them (in-place kwargs, out=)."""
        for i, (e, a) in enumerate(zip(_tensors(native_side), _tensors(other_side))):
            if a is e:  # not copied: on another device than the native one, or kept (CPU_ARGS)
                continue
            self.tensors_equal(e, a, f"input tensor {i} after the call", values)


def compare(expected, actual, where="output", values=True, native="cpu"):
    """Raise Mismatch unless actual (flagos run) equals expected (native run)."""
    _Comparer(native, DEVICE).compare(expected, actual, where, values)


# ---------------------------------------------------------------------------
# The sweep.


@dataclass
class PairResult:
    op: str
    dtype: torch.dtype
    ran: int = 0            # samples whose native run succeeded
    skipped: int = 0        # samples not run: the native run raised, or sparse
    sparse: int = 0         # of which sparse (flagos tensors are strided by design)
    error: str = ""         # first failing sample's error, first line
    fallbacks: set = field(default_factory=set)
    seconds: float = 0.0
    providers: dict = field(default_factory=dict)  # flagos calls per provider
    unstable: str = ""      # how the native device disagreed with itself (native_runs=2): set aside
    device_lost: str = ""   # the native device stopped working during the pair: the worker restarts

    @property
    def compared(self):
        return self.ran > 0 and not self.unstable

    @property
    def passed(self):
        return self.compared and not self.error

    def label(self):
        return f"{self.op}[{_short(self.dtype)}]"


@dataclass(repr=False)
class SweepResult:
    pairs: list
    native: str = "cpu"

    def __repr__(self):
        return f"<SweepResult vs {self.native}: {len(self.ran) - len(self.failures)}/{len(self.ran)} pairs passed>"

    @property
    def calls_by_provider(self):
        totals = {}
        for p in self.pairs:
            for provider, n in p.providers.items():
                totals[provider] = totals.get(provider, 0) + n
        return totals

    @property
    def ran(self):
        """Pairs compared: some sample ran natively, and the native side agreed with itself."""
        return [p for p in self.pairs if p.compared]

    @property
    def unstable(self):
        """Pairs set aside: the native device gave two different answers."""
        return [p for p in self.pairs if p.ran > 0 and p.unstable]

    @property
    def failures(self):
        return [p for p in self.ran if not p.passed]

    @property
    def rate(self):
        ran = self.ran
        return (len(ran) - len(self.failures)) / len(ran) if ran else 0.0

    @property
    def fallbacks(self):
        """{overload: sorted op names whose flagos run went through cpu_fallback}."""
        out = {}
        for p in self.pairs:
            for overload in p.fallbacks:
                out.setdefault(overload, set()).add(p.op)
        return {k: sorted(v) for k, v in sorted(out.items())}

    def failures_by_error(self):
        groups = {}
        for p in self.failures:
            groups.setdefault(p.error, []).append(p.label())
        return dict(sorted(groups.items(), key=lambda kv: -len(kv[1])))

    def report(self):
        ran = self.ran
        not_run = sum(1 for p in self.pairs if p.ran == 0)
        lines = [
            f"OpInfo sweep, flagos vs {self.native}: {len(ran) - len(self.failures)}/{len(ran)} (op, dtype) pairs "
            f"passed ({100 * self.rate:.2f}%); {not_run} pairs had no sample that ran on {self.native}",
            "flagos calls by provider: "
            + ", ".join(f"{k} {v}" for k, v in sorted(self.calls_by_provider.items())),
        ]
        sparse = sorted({p.op for p in self.pairs if p.sparse})
        if sparse:
            lines.append(f"not compared, sparse inputs or outputs (flagos tensors are strided): {', '.join(sparse)}")
        unstable = self.unstable
        if unstable:
            lines.append(f"{len(unstable)} pairs set aside, {self.native} disagreed with itself (nondeterministic; "
                         "neither passed nor failed):")
            for p in unstable:
                lines.append(f"  {p.label()}: {p.unstable}")
        lost = [p for p in self.pairs if p.device_lost]
        if lost:
            lines.append(f"{len(lost)} worker restarts after the device broke (a sticky asynchronous error):")
            for p in lost:
                lines.append(f"  {p.label()}: {p.device_lost}")
        if self.failures:
            lines.append(f"{len(self.failures)} failures, grouped by error (op[dtype]):")
            for err, names in self.failures_by_error().items():
                lines.append(f"  [{len(names)}] {err}")
                lines.append(f"      {', '.join(names)}")
            via_fallback = [p.label() for p in self.failures if p.fallbacks]
            if via_fallback:
                lines.append(f"  of which {len(via_fallback)} went through cpu_fallback (CPU's kernel, not "
                             f"{self.native}'s): {', '.join(via_fallback)}")
        fb = self.fallbacks
        if fb:
            lines.append(f"{len(fb)} overloads went through cpu_fallback:")
            for overload, ops in fb.items():
                lines.append(f"  {overload}: {', '.join(ops)}")
        return "\n".join(lines)


def _first_line(err):
    text = str(err).strip().splitlines()
    msg = text[0] if text else ""
    return f"{type(err).__name__}: {msg}"[:300]


def _call(op, sample):
    return op(sample.input, *sample.args, **sample.kwargs)


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)


def _strided_only(obj):
    return all(t.layout == torch.strided for t in _tensors(obj))


# Positional arguments that PyTorch requires on CPU whatever the input's device.
CPU_ARGS = {
    "tensor_split": {0},  # tensor_indices_or_sections must be a CPU tensor
}


def _copy_sample(op, sample, native, target):
    copy = _Copier(native, target)
    keep = CPU_ARGS.get(op.name, ())
    c_input = copy(sample.input)
    c_args = tuple(a if i in keep else copy(a) for i, a in enumerate(sample.args))
    c_kwargs = copy(sample.kwargs)
    if target == DEVICE:
        c_kwargs = _pin_native_choices(op, c_input, c_args, c_kwargs, native)
    return c_input, c_args, c_kwargs


def _pin_native_choices(op, f_input, f_args, f_kwargs, native):
    """Some Python-level ops choose an algorithm by device type: give flagos the native device's choice.

    linear_cross_entropy's options "auto" resolve per (device type, dtype);
    an unknown device type gets another accumulation dtype and chunking.
    """
    options = f_kwargs.get("options")
    if op.name == "nn.functional.linear_cross_entropy" and options is not None:
        weight = f_args[0]
        batches = f_input.shape[0] if f_input.dim() == 2 else 1
        f_kwargs = dict(f_kwargs, options=options._adjust(
            num_batches=batches, in_features=weight.shape[-1], num_classes=weight.shape[0],
            dtype=f_input.dtype, device=torch.device(native)))
    return f_kwargs


class DeviceLost(Exception):
    """The native device (or flagos on it) no longer runs anything: a sticky
    asynchronous error such as a device-side assert. The worker restarts."""

    def __init__(self, message, flagos_side):
        super().__init__(message)
        self.flagos_side = flagos_side


def _sync(device):
    """Wait for the device, so that an asynchronous kernel error is raised by
    the run that caused it. CPU runs synchronously."""
    if torch.device(device).type != "cpu":
        getattr(torch, torch.device(device).type).synchronize()


def _device_problem(native):
    """None while the native device and flagos still run kernels, else the error."""
    if torch.device(native).type == "cpu":
        return None
    try:
        for device in (native, DEVICE):
            torch.ones(1, device=device).add_(1).cpu()
            _sync(device)
    except Exception as err:
        return _first_line(err)
    return None


def _raise_if_lost(native, where, err, flagos_side):
    problem = _device_problem(native)
    if problem is not None:
        raise DeviceLost(f"{where}: {_first_line(err)} (then: {problem})", flagos_side) from err


def _run_sample(op, sample, seed, native="cpu", native_runs=1):
    """Runs one sample natively (native_runs times) and on flagos.

    Returns (outcome, unstable, trace or None): outcome is None (passed),
    "skip" (the native run raised), "sparse" (out of scope) or a one-line
    error; unstable says how a second native run differed from the first ("" if
    it did not, or did not run). Raises DeviceLost when the device broke.
    """
    if not _strided_only((sample.input, sample.args, sample.kwargs)):
        return "sparse", "", None
    # Copy before the native run: the op may mutate its inputs.
    try:
        f_input, f_args, f_kwargs = _copy_sample(op, sample, native, DEVICE)
    except Exception as err:  # moving to flagos is flagos's job
        _raise_if_lost(native, "input copy to flagos", err, flagos_side=True)
        return "input copy: " + _first_line(err), "", None
    again = None
    if native_runs > 1:
        try:
            again = _copy_sample(op, sample, native, native)
        except Exception as err:
            _raise_if_lost(native, "input copy on the native device", err, flagos_side=False)
            return "skip", "", None
    try:
        torch.manual_seed(seed)
        expected = _call(op, sample)
        _sync(native)
    except Exception as err:
        _raise_if_lost(native, f"{native} run", err, flagos_side=False)
        return "skip", "", None
    if not _strided_only(expected):
        return "sparse", "", None
    values = op.name not in UNINITIALIZED_OPS
    native_inputs = (sample.input, sample.args, sample.kwargs)
    unstable = ""
    if again is not None:
        same = _Comparer(native, native)
        try:
            torch.manual_seed(seed)
            expected_again = op(again[0], *again[1], **again[2])
            _sync(native)
            same.compare(expected, expected_again, "output", values)
            same.compare_inputs(native_inputs, again, values)
        except Exception as err:
            _raise_if_lost(native, f"second {native} run", err, flagos_side=False)
            unstable = _first_line(err)
    t = None
    try:
        with flagos_core.trace() as t:
            torch.manual_seed(seed)
            actual = op(f_input, *f_args, **f_kwargs)
        _sync(DEVICE)
        check = _Comparer(native, DEVICE)
        check.compare(expected, actual, "output", values)
        check.compare_inputs(native_inputs, (f_input, f_args, f_kwargs), values)
    except Exception as err:
        _raise_if_lost(native, "flagos run", err, flagos_side=True)
        return _first_line(err), unstable, t
    return None, unstable, t


def pairs_of(op_db, ops=None, dtypes=DTYPES, native="cpu"):
    """The (op, dtype) pairs the sweep covers, in a fixed order."""
    out = []
    for op in op_db:
        name = full_name(op)
        if ops is not None and name not in ops and op.name not in ops:
            continue
        supported = op.supported_dtypes(torch.device(native).type)
        out.extend((op, dtype) for dtype in dtypes if dtype in supported)
    return out


def run_pair(op, dtype, samples=SAMPLES_PER_PAIR, seed=0, native="cpu", native_runs=1):
    res = PairResult(full_name(op), dtype)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(seed)
        try:
            batch = list(itertools.islice(op.sample_inputs(native, dtype, requires_grad=False), samples))
        except Exception:
            batch = []
        for sample in batch:
            try:
                outcome, unstable, t = _run_sample(op, sample, seed, native, native_runs)
            except DeviceLost as lost:
                res.device_lost = str(lost)
                if lost.flagos_side:
                    res.ran += 1
                    res.error = res.error or f"device error: {lost}"[:300]
                else:
                    res.skipped += 1
                break
            if t is not None:
                res.fallbacks.update(t.fallbacks)
                for (_, provider), n in t.counts.items():
                    res.providers[provider] = res.providers.get(provider, 0) + n
            if outcome in ("skip", "sparse"):
                res.skipped += 1
                res.sparse += outcome == "sparse"
                continue
            res.ran += 1
            if unstable and not res.unstable:
                res.unstable = unstable
            if outcome and not res.error:
                res.error = outcome
        if not res.device_lost:
            problem = _device_problem(native)  # e.g. sample generation broke it
            if problem is not None:  # every run synced and was fine: blame the pair, as for a crash
                res.device_lost = f"after the pair: {problem}"
                res.ran = max(res.ran, 1)
                res.error = res.error or f"device error after the pair: {problem}"[:300]
    res.seconds = time.perf_counter() - start
    return res


def configure(deterministic=False, threads=None):
    """Process-wide settings for a sweep (a worker's, or the in-process sweep's)."""
    if threads:
        torch.set_num_threads(threads)
    if deterministic:
        # Deterministic algorithms for both sides (CUDA picks sort-based
        # kernels over atomics). Not the NaN fill of new memory that comes
        # with it: the native device's empty() would fill, flagos's (its own
        # allocator) does not, and only algorithms are meant to change.
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = False


def sweep(ops=None, samples=SAMPLES_PER_PAIR, verbose=False, native="cpu", native_runs=1, deterministic=False):
    """In-process sweep: simple, but a crashing op takes the process down.

    deterministic=True stays on in this process afterwards.
    """
    configure(deterministic)
    pairs = []
    for op, dtype in pairs_of(load_op_db(), ops, native=native):
        if verbose:
            print(f"-- {full_name(op)} {dtype}", file=sys.stderr, flush=True)
        pairs.append(run_pair(op, dtype, samples, native=native, native_runs=native_runs))
    return SweepResult(pairs, native)


# ---------------------------------------------------------------------------
# Crash- and hang-proof sweep: the pairs run in worker processes (`jobs` of
# them, worker k taking pairs k, k + jobs, ...) that log each pair as JSON
# lines; when a worker dies (a segfault in a kernel) or stops making progress,
# the pair it was in is recorded as a failure and a new worker resumes with
# the next pair of its share. A worker whose device broke (a sticky
# asynchronous error) logs its pair and asks for such a restart itself.

_DTYPE_NAMES = {str(d): d for d in DTYPES}
_RESTART_RC = 75
STARTUP_TIMEOUT = 180.0  # seconds a worker may take to start (imports, device, op_db) before it logs


def _worker(log_path, first, samples, ops, native="cpu", native_runs=1, deterministic=False, jobs=1, shard=0):
    import json

    threads = max(1, (os.cpu_count() or 1) // jobs) if jobs > 1 else None
    configure(deterministic, threads)
    pairs = pairs_of(load_op_db(), ops, native=native)
    with open(log_path, "a") as log:
        def emit(**event):
            log.write(json.dumps(event) + "\n")
            log.flush()

        emit(event="total", n=len(pairs))
        for i in range(first, len(pairs)):
            if i % jobs != shard:
                continue
            op, dtype = pairs[i]
            emit(event="start", i=i, op=full_name(op), dtype=str(dtype))
            r = run_pair(op, dtype, samples, native=native, native_runs=native_runs)
            emit(event="done", i=i, op=r.op, dtype=str(r.dtype), ran=r.ran, skipped=r.skipped, sparse=r.sparse,
                 error=r.error, fallbacks=sorted(r.fallbacks), seconds=r.seconds, providers=r.providers,
                 unstable=r.unstable, device_lost=r.device_lost)
            if r.device_lost:
                emit(event="restart", why=r.device_lost)
                log.close()
                os._exit(_RESTART_RC)  # a broken CUDA context cannot be torn down cleanly
        emit(event="end")


class _Shard:
    """One worker's share of the pairs, and the worker process running it now."""

    def __init__(self, index, jobs, tmp, base_cmd, env):
        self.index, self.jobs, self.tmp = index, jobs, tmp
        self.base_cmd, self.env = base_cmd, env
        self.launches = 0
        self.proc = None

    def launch(self, first):
        import subprocess

        self.log_path = os.path.join(self.tmp, f"shard{self.index}-worker{self.launches}.jsonl")
        self.err_path = self.log_path + ".stderr"
        self.launches += 1
        cmd = self.base_cmd + ["--worker", self.log_path, "--first", str(first),
                               "--jobs", str(self.jobs), "--shard", str(self.index)]
        with open(self.err_path, "w") as err_file:  # a file, not a pipe: a chatty worker never blocks
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err_file, env=self.env)
        self.last_size, self.last_progress, self.hung = -1, time.monotonic(), False

    def running(self, pair_timeout):
        """False once the worker has exited (killed here if it stopped making progress)."""
        if self.proc.poll() is not None:
            return False
        size = os.path.getsize(self.log_path) if os.path.exists(self.log_path) else 0
        if size != self.last_size:
            self.last_size, self.last_progress = size, time.monotonic()
        elif time.monotonic() - self.last_progress > (pair_timeout if size else max(pair_timeout, STARTUP_TIMEOUT)):
            self.hung = True
            self.kill()
            return False
        return True

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def collect(self, results, pair_timeout):
        """Records the exited worker's pairs; returns None when its share is
        done, else (where to resume, why, whether it crashed)."""
        import json
        import signal

        with open(self.err_path, errors="replace") as f:
            stderr = f.read()
        events = []
        if os.path.exists(self.log_path):
            with open(self.log_path) as f:
                events = [json.loads(line) for line in f if line.endswith("\n")]
        current = last_done = None
        for e in events:
            if e["event"] == "start":
                current = e
            elif e["event"] == "done":
                current, last_done = None, e
                results[e["i"]] = PairResult(e["op"], _DTYPE_NAMES[e["dtype"]], e["ran"], e["skipped"],
                                             e["sparse"], e["error"], set(e["fallbacks"]), e["seconds"],
                                             e["providers"], e["unstable"], e["device_lost"])
        if events and events[-1]["event"] == "end":
            return None
        if events and events[-1]["event"] == "restart" and last_done is not None:
            return last_done["i"] + 1, "device lost: " + events[-1]["why"], False
        if current is None and last_done is None:
            raise RuntimeError(f"OpInfo sweep worker failed before running a pair (rc={self.proc.returncode}):\n"
                               + stderr[-3000:])
        rc = self.proc.returncode
        if self.hung:
            why = f"hang: no progress for {pair_timeout:.0f}s, worker killed"
        elif rc < 0:
            why = f"crash: worker killed by {signal.Signals(-rc).name}"
        else:
            tail = [ln for ln in stderr.strip().splitlines() if ln.strip()]
            why = f"crash: worker exited with rc={rc}: " + (tail[-1] if tail else "")
        if current is None:  # died between pairs: blame the one whose objects were being freed
            current = last_done
            why += " (after the pair finished)"
        results[current["i"]] = PairResult(current["op"], _DTYPE_NAMES[current["dtype"]], ran=1, error=why)
        return current["i"] + 1, why, True


def sweep_isolated(ops=None, samples=SAMPLES_PER_PAIR, pair_timeout=60.0, max_restarts=50, *,
                   native="cpu", native_runs=1, deterministic=False, jobs=1):
    """The sweep in `jobs` worker processes; see sweep() for the rest.

    native: the device flagos is compared with; native_runs=2 sets aside the
    pairs where it disagrees with itself; deterministic turns on
    torch.use_deterministic_algorithms(warn_only=True) in the workers.
    """
    import tempfile

    base_cmd = [sys.executable, os.path.abspath(__file__), "--samples", str(samples), "--native", native,
                "--native-runs", str(native_runs), "--deterministic" if deterministic else "--no-deterministic"]
    if ops:
        base_cmd += ["--ops", ",".join(sorted(ops))]
    env = dict(os.environ)
    if deterministic:
        env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS reads it when a process first uses it
    results = {}
    restarts = 0
    with tempfile.TemporaryDirectory() as tmp:
        shards = [_Shard(k, jobs, tmp, base_cmd, env) for k in range(jobs)]
        try:
            for shard in shards:
                shard.launch(0)
            active = list(shards)
            while active:
                time.sleep(0.2)
                for shard in list(active):
                    if shard.running(pair_timeout):
                        continue
                    resume = shard.collect(results, pair_timeout)
                    if resume is None:
                        active.remove(shard)
                        continue
                    first, why, crashed = resume
                    restarts += 1
                    if restarts > max_restarts:
                        raise RuntimeError(f"OpInfo sweep: more than {max_restarts} worker restarts; last: "
                                           f"pair {first - 1}: {why}")
                    shard.launch(first)
        finally:
            for shard in shards:
                shard.kill()
    return SweepResult([results[i] for i in sorted(results)], native)


def main(argv=None):
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--native", default=None,
                        help=f"device to compare with (default: the runtime's, or ${NATIVE_ENV})")
    parser.add_argument("--samples", type=int, default=SAMPLES_PER_PAIR)
    parser.add_argument("--ops", default=None, help="comma-separated op names")
    parser.add_argument("--accelerator-options", action="store_true",
                        help="the settings used for an accelerator's native device, whatever --native is")
    parser.add_argument("--native-runs", type=int, default=None, help="2: set aside pairs the native device "
                        "disagrees with itself on")
    parser.add_argument("--deterministic", action=argparse.BooleanOptionalAction, default=None,
                        help="torch.use_deterministic_algorithms(True, warn_only=True)")
    parser.add_argument("--jobs", type=int, default=None, help="worker processes")
    parser.add_argument("--in-process", action="store_true", help="no worker process (a crash ends the sweep)")
    parser.add_argument("--verbose", action="store_true", help="name each pair before running it (--in-process)")
    parser.add_argument("--timing", action="store_true", help="print the slowest pairs")
    parser.add_argument("--worker", metavar="LOG", help=argparse.SUPPRESS)
    parser.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--shard", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    ops = set(args.ops.split(",")) if args.ops else None
    native = args.native or native_device()
    if args.worker:
        _worker(args.worker, args.first, args.samples, ops, native, args.native_runs or 1, bool(args.deterministic),
                args.jobs or 1, args.shard)
        return
    options = accelerator_options() if args.accelerator_options or native != "cpu" else {}
    for key in ("native_runs", "deterministic", "jobs"):
        if getattr(args, key) is not None:
            options[key] = getattr(args, key)
    start = time.perf_counter()
    if args.in_process:
        options.pop("jobs", None)
        result = sweep(ops=ops, samples=args.samples, verbose=args.verbose, native=native, **options)
    else:
        result = sweep_isolated(ops=ops, samples=args.samples, native=native, **options)
    print(result.report())
    if args.timing:
        print("slowest pairs:")
        for p in sorted(result.pairs, key=lambda p: -p.seconds)[:40]:
            print(f"  {p.seconds:7.2f}s {p.op} {p.dtype}")
    print(f"sweep took {time.perf_counter() - start:.1f}s")


if __name__ == "__main__":
    main()
