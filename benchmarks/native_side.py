"""The native-CUDA side of a comparison, in its own process.

PyTorch's autograd engine takes its streams from `at::getAccelerator()`, which
is PrivateUse1 (flagos) once flagos is registered, so a CUDA backward in a
process that imported flagos fails inside PyTorch ("opt_ready_stream &&
opt_parent_stream", pytorch/pytorch#161129). Training on native CUDA
therefore runs here, in a process that never imports flagos; the caller
drives it block by block, so both sides still alternate on one GPU.

Protocol: one JSON command per stdin line, one JSON reply per stdout line.
"""

import json
import os
import sys

os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"  # before torch: no flagos here

import torch  # noqa: E402

import qwen3_06b  # noqa: E402

DEVICE = "cuda"


def serve():
    trainer = None
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd.pop("op")
        if op == "deterministic":
            torch.use_deterministic_algorithms(cmd["on"])
            reply = {}
        elif op == "trainer":
            if trainer:
                trainer.close()
            trainer = qwen3_06b.Trainer(DEVICE, getattr(torch, cmd.pop("dtype")), **cmd)
            reply = {}
        elif op == "close":  # frees the trainer's model and optimizer
            if trainer:
                trainer.close()
            trainer = None
            reply = {}
        elif op == "block":
            seconds, losses = trainer.block(cmd["index"])
            reply = {"seconds": seconds, "losses": losses}
        elif op == "peak":
            reply = {"bytes": trainer.peak_bytes(cmd["index"])}
        elif op == "eval":  # small references for tests: code sets `result`
            scope = {"torch": torch}
            exec(cmd["code"], scope)
            path = cmd["path"]
            torch.save(scope["result"], path)
            reply = {"path": path}
        elif op == "quit":
            break
        else:
            reply = {"error": f"unknown op {op}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


class NativeSide:
    """Client: starts native_side.py and sends it commands."""

    def __init__(self):
        import subprocess

        here = os.path.dirname(os.path.abspath(__file__))
        env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0", PYTHONPATH=here)
        self.proc = subprocess.Popen([sys.executable, os.path.join(here, "native_side.py")], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)

    def __call__(self, op, **kwargs):
        self.proc.stdin.write(json.dumps(dict(op=op, **kwargs)) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"native side exited ({self.proc.wait()}) during {op}")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return reply

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait()


if __name__ == "__main__":
    serve()
