"""Qwen3-0.6B (published sizes, random init, no download) on a given device:
the model, a training step and greedy decoding, shared by the GPU parity
tests and the GPU benchmark."""

import time

import torch


def config():
    from transformers import Qwen3Config

    return Qwen3Config(
        hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
        intermediate_size=3072, vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=4096,
        attn_implementation="sdpa")


def build(device, dtype, seed=0):
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config()).to(dtype)  # same init on CPU for both sides
    return model.to(device)


def batches(steps, batch, seq, seed=1, vocab=151936):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (batch, seq), generator=g) for _ in range(steps)]


def train(model, data, device, lr=1e-4):
    """Loss of each step, as Python floats."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, foreach=True)
    losses = []
    for ids in data:
        ids = ids.to(device)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


@torch.no_grad()
def greedy(model, prompt, new_tokens, device):
    out = model.generate(
        prompt.to(device), max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
        pad_token_id=0, eos_token_id=None)
    return out[0, prompt.shape[1]:].cpu()


class Trainer:
    """One model and optimizer, trained block by block."""

    def __init__(self, device, dtype, batch, seq, steps_per_block, blocks, seed=1):
        self.device = device
        self.model = build(device, dtype)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, foreach=True)
        self.data = batches(steps_per_block * blocks, batch, seq, seed=seed)
        self.steps = steps_per_block

    def block(self, index):
        """(seconds, losses) of steps_per_block training steps."""
        torch.accelerator.synchronize()
        start = time.perf_counter()
        losses = []
        for ids in self.data[index * self.steps:(index + 1) * self.steps]:
            ids = ids.to(self.device)
            loss = self.model(input_ids=ids, labels=ids).loss
            loss.backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            losses.append(loss.detach())
        torch.accelerator.synchronize()
        return time.perf_counter() - start, [l.item() for l in losses]

    def peak_bytes(self, index):
        """Peak memory of one more block above what is resident before it."""
        torch.accelerator.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        self.block(index)
        return torch.cuda.max_memory_allocated() - base

    def close(self):
        del self.model, self.opt
        torch.cuda.empty_cache()
