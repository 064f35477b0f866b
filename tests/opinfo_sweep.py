"""Sweep PyTorch's OpInfo database, comparing flagos with CPU bit for bit.

Used by tests/test_opinfo_sweep.py; it can also be run on its own:

    python tests/opinfo_sweep.py [--samples N] [--ops name,name] [--timing]

For every OpInfo and every dtype of DTYPES that the op supports on CPU, the
first few sample inputs are run on CPU, then on flagos (inputs copied with the
same storage layout, views and aliasing), and the results, plus the inputs
after the call (ops may mutate them), are compared exactly (NaN equals NaN).
Each side runs right after the same torch.manual_seed, so random ops (whose
flagos generator reproduces CPU's numbers) are compared exactly too. A sample
whose CPU run raises is skipped: that is not a flagos failure. Sparse inputs
and outputs are not compared: flagos tensors are strided.
"""

import itertools
import math
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

# Ops that return uninitialized memory: only dtype, shape and device are compared.
UNINITIALIZED_OPS = frozenset({
    "empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided",
    "empty_permuted",
})


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


# ---------------------------------------------------------------------------
# Moving sample inputs to flagos, and results back.


class _ToFlagos:
    """Copies CPU tensors to flagos keeping storage, offset, sizes and strides.

    Tensors that share a CPU storage share one flagos storage too, so views,
    overlapping (expanded) inputs and aliasing between arguments carry over.
    """

    def __init__(self):
        self.storages = {}

    def storage_for(self, t):
        s = t.untyped_storage()
        key = (s.data_ptr(), s.nbytes())
        if key not in self.storages:
            raw = torch.empty(0, dtype=torch.uint8).set_(s)
            self.storages[key] = raw.to(DEVICE).untyped_storage()
        return self.storages[key]

    def tensor(self, t):
        if t.device.type != "cpu":
            return t
        plain = (t.layout == torch.strided and not t.is_quantized and not t.is_conj()
                 and not t.is_neg() and type(t) is torch.Tensor and t.untyped_storage().data_ptr() != 0)
        if plain:
            out = torch.empty(0, dtype=t.dtype, device=DEVICE)
            out.set_(self.storage_for(t), t.storage_offset(), t.size(), t.stride())
        else:
            out = t.to(DEVICE)
        if t.requires_grad:
            out.requires_grad_()
        return out

    def __call__(self, obj):
        if isinstance(obj, torch.Tensor):
            return self.tensor(obj)
        if isinstance(obj, torch.device):
            return torch.device(DEVICE) if obj.type == "cpu" else obj
        if isinstance(obj, str) and obj == "cpu":
            return DEVICE
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):
            return type(obj)(*(self(o) for o in obj))
        if isinstance(obj, (list, tuple)):
            return type(obj)(self(o) for o in obj)
        if isinstance(obj, dict):
            return {k: self(v) for k, v in obj.items()}
        return obj


class Mismatch(AssertionError):
    pass


def _tensors_equal(expected, actual, where, values=True):
    if not isinstance(actual, torch.Tensor):
        raise Mismatch(f"{where}: expected a tensor, got {type(actual).__name__}")
    if expected.device.type == "cpu" and actual.device.type != DEVICE:
        raise Mismatch(f"{where}: result is on {actual.device}, expected {DEVICE}")
    if actual.dtype != expected.dtype:
        raise Mismatch(f"{where}: dtype {actual.dtype} != {expected.dtype}")
    if actual.shape != expected.shape:
        raise Mismatch(f"{where}: shape {tuple(actual.shape)} != {tuple(expected.shape)}")
    if actual.layout != expected.layout:
        raise Mismatch(f"{where}: layout {actual.layout} != {expected.layout}")
    if not values:
        return
    a = actual.detach().cpu()
    e = expected.detach()
    if e.layout != torch.strided:
        a, e = a.to_dense(), e.to_dense()
    try:
        torch.testing.assert_close(a, e, rtol=0, atol=0, equal_nan=True,
                                   check_device=False, check_stride=False)
    except AssertionError as err:
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
        raise Mismatch(f"{where}: values differ: " + " ".join(lines[:3])) from None


def compare(expected, actual, where="output", values=True):
    """Raise Mismatch unless actual (flagos run) equals expected (CPU run)."""
    if isinstance(expected, torch.Tensor):
        return _tensors_equal(expected, actual, where, values)
    if isinstance(expected, (list, tuple)) and not isinstance(expected, torch.Size):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            raise Mismatch(f"{where}: expected a sequence of {len(expected)}, got {type(actual).__name__}")
        for i, (e, a) in enumerate(zip(expected, actual)):
            compare(e, a, f"{where}[{i}]", values)
        return
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or actual.keys() != expected.keys():
            raise Mismatch(f"{where}: dict keys differ")
        for k in expected:
            compare(expected[k], actual[k], f"{where}[{k!r}]", values)
        return
    if isinstance(expected, torch.device):
        want = torch.device(DEVICE) if expected.type == "cpu" else expected
        if torch.device(actual).type != want.type:
            raise Mismatch(f"{where}: device {actual} != {want}")
        return
    if isinstance(expected, str) and expected == "cpu" and actual == DEVICE:
        return
    if isinstance(expected, float) and isinstance(actual, float):
        if math.isnan(expected) and math.isnan(actual):
            return
    if not values and isinstance(expected, (int, float, complex)):
        return
    if type(actual) is not type(expected) or actual != expected:
        raise Mismatch(f"{where}: {actual!r} != {expected!r}")


# ---------------------------------------------------------------------------
# The sweep.


@dataclass
class PairResult:
    op: str
    dtype: torch.dtype
    ran: int = 0            # samples whose CPU run succeeded
    skipped: int = 0        # samples not run: CPU raised, or sparse
    sparse: int = 0         # of which sparse (flagos tensors are strided by design)
    error: str = ""         # first failing sample's error, first line
    fallbacks: set = field(default_factory=set)
    seconds: float = 0.0
    providers: dict = field(default_factory=dict)  # flagos calls per provider

    @property
    def passed(self):
        return self.ran > 0 and not self.error


@dataclass(repr=False)
class SweepResult:
    pairs: list

    def __repr__(self):
        return f"<SweepResult: {len(self.ran) - len(self.failures)}/{len(self.ran)} pairs passed>"

    @property
    def calls_by_provider(self):
        totals = {}
        for p in self.pairs:
            for provider, n in p.providers.items():
                totals[provider] = totals.get(provider, 0) + n
        return totals

    @property
    def ran(self):
        return [p for p in self.pairs if p.ran > 0]

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
            groups.setdefault(p.error, []).append(f"{p.op}[{str(p.dtype).replace('torch.', '')}]")
        return dict(sorted(groups.items(), key=lambda kv: -len(kv[1])))

    def report(self):
        ran = self.ran
        lines = [
            f"OpInfo sweep: {len(ran) - len(self.failures)}/{len(ran)} (op, dtype) pairs passed "
            f"({100 * self.rate:.2f}%); {len(self.pairs) - len(ran)} pairs had no sample that ran on CPU",
            "flagos calls by provider: "
            + ", ".join(f"{k} {v}" for k, v in sorted(self.calls_by_provider.items())),
        ]
        sparse = sorted({p.op for p in self.pairs if p.sparse})
        if sparse:
            lines.append(f"not compared, sparse inputs or outputs (flagos tensors are strided): {', '.join(sparse)}")
        if self.failures:
            lines.append(f"{len(self.failures)} failures, grouped by error (op[dtype]):")
            for err, names in self.failures_by_error().items():
                lines.append(f"  [{len(names)}] {err}")
                lines.append(f"      {', '.join(names)}")
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


def _to_flagos_sample(op, sample):
    move = _ToFlagos()
    keep = CPU_ARGS.get(op.name, ())
    f_input = move(sample.input)
    f_args = tuple(a if i in keep else move(a) for i, a in enumerate(sample.args))
    f_kwargs = _pin_cpu_choices(op, f_input, f_args, move(sample.kwargs))
    return f_input, f_args, f_kwargs


def _pin_cpu_choices(op, f_input, f_args, f_kwargs):
    """Some Python-level ops choose an algorithm by device type: give flagos CPU's choice.

    linear_cross_entropy's options "auto" resolve per (device type, dtype);
    an unknown device type gets another accumulation dtype and chunking.
    """
    options = f_kwargs.get("options")
    if op.name == "nn.functional.linear_cross_entropy" and options is not None:
        weight = f_args[0]
        batches = f_input.shape[0] if f_input.dim() == 2 else 1
        f_kwargs = dict(f_kwargs, options=options._adjust(
            num_batches=batches, in_features=weight.shape[-1], num_classes=weight.shape[0],
            dtype=f_input.dtype, device=torch.device("cpu")))
    return f_kwargs


def _compare_inputs(cpu_side, flagos_side, values):
    """Inputs after the call: an op may write into them (in-place kwargs, out=)."""
    for i, (e, a) in enumerate(zip(_tensors(cpu_side), _tensors(flagos_side))):
        if a is e:  # kept on CPU (CPU_ARGS)
            continue
        _tensors_equal(e, a, f"input tensor {i} after the call", values)


def _run_sample(op, sample, seed):
    """Returns (outcome, trace or None); outcome is None (passed), "skip" (CPU
    raised), "sparse" (out of scope) or a one-line error."""
    if not _strided_only((sample.input, sample.args, sample.kwargs)):
        return "sparse", None
    # Copy before the CPU run: the op may mutate its inputs.
    try:
        f_input, f_args, f_kwargs = _to_flagos_sample(op, sample)
    except Exception as err:  # moving to flagos is flagos's job
        return "input copy: " + _first_line(err), None
    try:
        torch.manual_seed(seed)
        expected = _call(op, sample)
    except Exception:
        return "skip", None
    if not _strided_only(expected):
        return "sparse", None
    t = None
    try:
        with flagos_core.trace() as t:
            torch.manual_seed(seed)
            actual = op(f_input, *f_args, **f_kwargs)
        values = op.name not in UNINITIALIZED_OPS
        compare(expected, actual, "output", values)
        _compare_inputs((sample.input, sample.args, sample.kwargs), (f_input, f_args, f_kwargs), values)
    except Exception as err:
        return _first_line(err), t
    return None, t


def pairs_of(op_db, ops=None, dtypes=DTYPES):
    """The (op, dtype) pairs the sweep covers, in a fixed order."""
    out = []
    for op in op_db:
        name = full_name(op)
        if ops is not None and name not in ops and op.name not in ops:
            continue
        supported = op.supported_dtypes("cpu")
        out.extend((op, dtype) for dtype in dtypes if dtype in supported)
    return out


def run_pair(op, dtype, samples=SAMPLES_PER_PAIR, seed=0):
    res = PairResult(full_name(op), dtype)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(seed)
        try:
            batch = list(itertools.islice(op.sample_inputs("cpu", dtype, requires_grad=False), samples))
        except Exception:
            batch = []
        for sample in batch:
            outcome, t = _run_sample(op, sample, seed)
            if t is not None:
                res.fallbacks.update(t.fallbacks)
                for (_, provider), n in t.counts.items():
                    res.providers[provider] = res.providers.get(provider, 0) + n
            if outcome in ("skip", "sparse"):
                res.skipped += 1
                res.sparse += outcome == "sparse"
                continue
            res.ran += 1
            if outcome and not res.error:
                res.error = outcome
    res.seconds = time.perf_counter() - start
    return res


def sweep(ops=None, samples=SAMPLES_PER_PAIR, verbose=False):
    """In-process sweep: simple, but a crashing op takes the process down."""
    pairs = []
    for op, dtype in pairs_of(load_op_db(), ops):
        if verbose:
            print(f"-- {full_name(op)} {dtype}", file=sys.stderr, flush=True)
        pairs.append(run_pair(op, dtype, samples))
    return SweepResult(pairs)


# ---------------------------------------------------------------------------
# Crash- and hang-proof sweep: the pairs run in a worker process that logs
# each pair as JSON lines; when the worker dies (a segfault in a kernel) or
# stops making progress, the pair it was in is recorded as a failure and a new
# worker resumes with the next pair.

_DTYPE_NAMES = {str(d): d for d in DTYPES}


def _worker(log_path, first, samples, ops):
    import json

    pairs = pairs_of(load_op_db(), ops)
    with open(log_path, "a") as log:
        def emit(**event):
            log.write(json.dumps(event) + "\n")
            log.flush()

        emit(event="total", n=len(pairs))
        for i in range(first, len(pairs)):
            op, dtype = pairs[i]
            emit(event="start", i=i, op=full_name(op), dtype=str(dtype))
            r = run_pair(op, dtype, samples)
            emit(event="done", i=i, op=r.op, dtype=str(r.dtype), ran=r.ran, skipped=r.skipped, sparse=r.sparse,
                 error=r.error, fallbacks=sorted(r.fallbacks), seconds=r.seconds, providers=r.providers)
        emit(event="end")


def sweep_isolated(ops=None, samples=SAMPLES_PER_PAIR, pair_timeout=60.0, max_restarts=50):
    import json
    import os
    import signal
    import subprocess
    import tempfile

    results = {}
    first = 0
    restarts = 0
    with tempfile.TemporaryDirectory() as tmp:
        while True:
            log_path = os.path.join(tmp, f"worker{restarts}.jsonl")
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", log_path,
                   "--first", str(first), "--samples", str(samples)]
            if ops:
                cmd += ["--ops", ",".join(sorted(ops))]
            err_path = log_path + ".stderr"
            with open(err_path, "w") as err_file:  # a file, not a pipe: a chatty worker never blocks
                proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err_file)
            last_size, last_progress, hung = -1, time.monotonic(), False
            while proc.poll() is None:
                time.sleep(0.2)
                size = os.path.getsize(log_path) if os.path.exists(log_path) else 0
                if size != last_size:
                    last_size, last_progress = size, time.monotonic()
                elif time.monotonic() - last_progress > pair_timeout:
                    hung = True
                    proc.kill()
                    proc.wait()
            with open(err_path, errors="replace") as f:
                stderr = f.read()
            events = []
            if os.path.exists(log_path):
                with open(log_path) as f:
                    events = [json.loads(line) for line in f if line.endswith("\n")]
            current = last_done = None
            for e in events:
                if e["event"] == "start":
                    current = e
                elif e["event"] == "done":
                    current, last_done = None, e
                    results[e["i"]] = PairResult(e["op"], _DTYPE_NAMES[e["dtype"]], e["ran"], e["skipped"],
                                                 e["sparse"], e["error"], set(e["fallbacks"]), e["seconds"], e["providers"])
            if events and events[-1]["event"] == "end":
                break
            if current is None and last_done is None:
                raise RuntimeError(f"OpInfo sweep worker failed before running a pair (rc={proc.returncode}):\n"
                                   + stderr[-3000:])
            rc = proc.returncode
            if hung:
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
            first = current["i"] + 1
            restarts += 1
            if restarts > max_restarts:
                raise RuntimeError(f"OpInfo sweep: more than {max_restarts} worker crashes; last: "
                                   f"{current['op']} {current['dtype']}: {why}")
    return SweepResult([results[i] for i in sorted(results)])


def main(argv=None):
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=SAMPLES_PER_PAIR)
    parser.add_argument("--ops", default=None, help="comma-separated op names")
    parser.add_argument("--in-process", action="store_true", help="no worker process (a crash ends the sweep)")
    parser.add_argument("--verbose", action="store_true", help="name each pair before running it (--in-process)")
    parser.add_argument("--timing", action="store_true", help="print the slowest pairs")
    parser.add_argument("--worker", metavar="LOG", help=argparse.SUPPRESS)
    parser.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    ops = set(args.ops.split(",")) if args.ops else None
    if args.worker:
        _worker(args.worker, args.first, args.samples, ops)
        return
    start = time.perf_counter()
    if args.in_process:
        result = sweep(ops=ops, samples=args.samples, verbose=args.verbose)
    else:
        result = sweep_isolated(ops=ops, samples=args.samples)
    print(result.report())
    if args.timing:
        print("slowest pairs:")
        for p in sorted(result.pairs, key=lambda p: -p.seconds)[:40]:
            print(f"  {p.seconds:7.2f}s {p.op} {p.dtype}")
    print(f"sweep took {time.perf_counter() - start:.1f}s")


if __name__ == "__main__":
    main()
