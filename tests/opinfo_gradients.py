"""Gradients across PyTorch's OpInfo database, flagos against CPU bit for bit.

The forward sweep (tests/opinfo_sweep.py) runs samples that require no grad.
This one takes float32 samples of every op that supports autograd, with their
inputs requiring grad, and compares the gradients of the sum of the floating
outputs with respect to those inputs. Inputs are copied as the forward sweep
copies them (storage layout, views and aliasing kept). The host runtime only:
a native accelerator's backward cannot run in a process that loaded flagos
(pytorch/pytorch#161129).

    python tests/opinfo_gradients.py [--samples N] [--ops name,name]
"""

import itertools
import sys
import warnings
from dataclasses import dataclass, field

import torch

import opinfo_sweep
from opinfo_sweep import DEVICE, _copy_sample, _first_line, _strided_only, _tensors, compare, full_name

SAMPLES_PER_OP = 2

# Ops whose gradients differ from CPU's by design, and why.
KNOWN_DIFFERENCES = {}  # none known since rms_norm decomposes as on the CPU (_host_norms.py)


def _gradients(outputs, wrt):
    floating = [t for t in _tensors(outputs) if t.requires_grad and t.is_floating_point()]
    if not floating or not wrt:
        return None
    return torch.autograd.grad(sum(t.sum() for t in floating), wrt, allow_unused=True)


def run_sample(op, sample, seed=0):
    """None where flagos's gradients equal CPU's, "skip" where CPU's backward
    cannot run (or there is nothing to differentiate), else a one-line error."""
    if not _strided_only((sample.input, sample.args, sample.kwargs)):
        return "skip"
    f_input, f_args, f_kwargs = _copy_sample(op, sample, "cpu", DEVICE)
    try:
        torch.manual_seed(seed)
        out = op(sample.input, *sample.args, **sample.kwargs)
        if not _strided_only(out):  # sparse results: out of scope, as in the forward sweep
            return "skip"
        expected = _gradients(out, [t for t in _tensors((sample.input, sample.args, sample.kwargs)) if t.requires_grad])
    except Exception:
        return "skip"
    if expected is None:
        return "skip"
    try:
        torch.manual_seed(seed)
        actual = _gradients(op(f_input, *f_args, **f_kwargs),
                            [t for t in _tensors((f_input, f_args, f_kwargs)) if t.requires_grad])
        compare(list(expected), list(actual) if actual is not None else None, "gradient")
    except Exception as err:
        return _first_line(err)
    return None


@dataclass
class GradientResult:
    ran: int = 0
    failures: dict = field(default_factory=dict)  # op: first error

    @property
    def rate(self):
        return 1 - len(self.failures) / max(1, self.ran)

    def report(self):
        lines = [f"OpInfo gradients, flagos vs cpu: {self.ran} samples, {len(self.failures)} ops differ"]
        lines += [f"  {op}: {error}" for op, error in sorted(self.failures.items())]
        return "\n".join(lines)


def sweep(ops=None, samples=SAMPLES_PER_OP):
    result = GradientResult()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for op in opinfo_sweep.load_op_db():
            name = full_name(op)
            if ops is not None and name not in ops and op.name not in ops:
                continue
            if not op.supports_autograd or torch.float32 not in op.supported_dtypes("cpu"):
                continue
            torch.manual_seed(0)
            try:
                batch = list(itertools.islice(op.sample_inputs("cpu", torch.float32, requires_grad=True), samples))
            except Exception:
                continue
            for sample in batch:
                outcome = run_sample(op, sample)
                if outcome == "skip":
                    continue
                result.ran += 1
                if outcome is not None:
                    result.failures.setdefault(name, outcome)
    return result


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=SAMPLES_PER_OP)
    parser.add_argument("--ops", default=None, help="comma-separated op names")
    args = parser.parse_args()
    print(sweep(set(args.ops.split(",")) if args.ops else None, args.samples).report())
    sys.exit(0)
