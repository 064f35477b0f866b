"""On the host runtime a flagos backward runs on the calling thread, as a CPU
backward does (HostRuntime.cpp says why: a second OpenMP team on autograd's
worker thread oversubscribed the cores)."""

import subprocess
import sys
import threading

import pytest
import torch

import flagos_core

pytestmark = pytest.mark.skipif(flagos_core.runtime()["name"] != "host", reason="host runtime behaviour")


def backward_threads(fn_before_backward=None):
    """Thread ids that ran the backward of a small flagos graph, and its gradient."""
    torch.manual_seed(0)
    x = torch.randn(8, device="flagos", requires_grad=True)
    ran_on = []
    x.register_hook(lambda grad: ran_on.append(threading.get_ident()))
    loss = (x.sin() * x).sum()
    if fn_before_backward is None:
        loss.backward()
    else:
        with fn_before_backward():
            loss.backward()
    return ran_on, x


def test_backward_runs_on_the_calling_thread():
    ran_on, x = backward_threads()
    assert ran_on == [threading.get_ident()]
    ref = x.detach().cpu().requires_grad_()
    (ref.sin() * ref).sum().backward()
    assert torch.equal(x.grad.cpu(), ref.grad)


def test_backward_runs_on_the_calling_thread_in_a_new_thread():
    result = {}

    def work():
        ran_on, _ = backward_threads()
        result["ran_on"], result["me"] = ran_on, threading.get_ident()

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert result["ran_on"] == [result["me"]]


def test_multithreading_can_be_turned_back_on():
    # After the thread's first flagos op, PyTorch's own switch decides again:
    # with it on, the backward goes to autograd's worker thread for the device.
    ran_on, x = backward_threads(lambda: torch.autograd.set_multithreading_enabled(True))
    assert len(ran_on) == 1 and ran_on[0] != threading.get_ident()
    assert x.grad is not None
    assert not torch.autograd.is_multithreading_enabled()  # the context restored the host default


def test_a_choice_made_after_import_stands_on_the_importing_thread():
    # A fresh process, so that the choice comes before the thread's first
    # flagos op: the host runtime set its default at import, and later ops
    # do not undo what the program chose after that.
    code = (
        "import threading, torch\n"
        "torch.autograd.set_multithreading_enabled(True)\n"
        "x = torch.randn(8, device='flagos', requires_grad=True)\n"
        "ran_on = []\n"
        "x.register_hook(lambda g: ran_on.append(threading.get_ident()))\n"
        "(x.sin() * x).sum().backward()\n"
        "print(ran_on[0] != threading.get_ident(), torch.autograd.is_multithreading_enabled())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True"], out.stdout + out.stderr
