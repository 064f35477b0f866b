"""One side of a comparison, native CUDA or flagos, in a process of its own.

PyTorch's autograd engine takes its streams from `at::getAccelerator()`, which
is PrivateUse1 (flagos) once flagos is registered, so a CUDA backward in a
process that imported flagos fails inside PyTorch ("opt_ready_stream &&
opt_parent_stream", pytorch/pytorch#161129). Training on native CUDA
therefore runs in a process that never imports flagos. The training
benchmark runs flagos in a process of its own as well: two processes of one
program differ in speed by up to ~10% on the lent GPU machine (pinned to the
same CPUs or not), so a fair comparison needs the same setting on both sides
and several fresh pairs of processes. The caller drives both block by block, so
the sides still alternate on one GPU.

    python side_process.py DEVICE     DEVICE: cuda (no flagos), flagos, cpu

SideProcess(device, cpus) pins the process, all its threads, to `cpus`: two
side processes pinned to the same CPUs and driven in turn run on the same
cores.

Protocol: one JSON command per stdin line, one JSON reply per stdout line.
"""

import json
import os
import sys

SERVES_FLAGOS = __name__ == "__main__" and sys.argv[1:] == ["flagos"]
if __name__ == "__main__":
    if not SERVES_FLAGOS:
        os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"  # before torch: no flagos here
    if os.environ.get("FLAGOS_SIDE_CPUS"):  # before torch starts its threads: they inherit it
        os.sched_setaffinity(0, [int(c) for c in os.environ["FLAGOS_SIDE_CPUS"].split(",")])

import torch  # noqa: E402

if SERVES_FLAGOS:
    import flagos_core  # noqa: E402,F401  (autoload may be off)

import qwen3_06b  # noqa: E402


def serve(device):
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
            trainer = qwen3_06b.Trainer(device, getattr(torch, cmd.pop("dtype")), **cmd)
            reply = {}
        elif op == "close":  # frees the trainer's model and optimizer
            if trainer:
                trainer.close()
            trainer = None
            reply = {}
        elif op == "block":
            seconds, losses = trainer.block(cmd["index"])
            reply = {"seconds": seconds, "losses": losses}
        elif op == "device_work":
            reply = trainer.device_work(cmd["index"])
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


class SideProcess:
    """Client: starts side_process.py for `device` and sends it commands.
    Starting returns at once; the first command waits for the process to be
    ready, so several can start together."""

    def __init__(self, device="cuda", cpus=None):
        import subprocess

        here = os.path.dirname(os.path.abspath(__file__))
        env = dict(os.environ, PYTHONPATH=here, FLAGOS_SIDE_CPUS=",".join(map(str, cpus or ())))
        env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)  # the process decides, from its device
        self.device = device
        self.proc = subprocess.Popen([sys.executable, os.path.join(here, "side_process.py"), device],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def __call__(self, op, **kwargs):
        self.proc.stdin.write(json.dumps(dict(op=op, **kwargs)) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.device} side process exited ({self.proc.wait()}) during {op}")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return reply

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait()


if __name__ == "__main__":
    serve(sys.argv[1])
