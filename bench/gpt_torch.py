#!/usr/bin/python3
"""Chapter 12's GPT in PyTorch, module for module as nanoGPT builds it (bias=True, no dropout).

The module tree has nanoGPT's names (transformer.wte, transformer.h.0.attn.c_attn, ..., lm_head,
the output layer tied to wte), so a state_dict that loads here with strict=True has nanoGPT's
keys and shapes. Two uses:

  gpt_torch.py check SNAPSHOT [options]
      load the weights examples/ch12_gpt saved (a safetensors file) with strict=True, and print
      the train and validation losses on the batches that program estimates them on; the test
      (tests/run.sh, gpt_snapshot_loads_into_pytorch) compares them with the program's own.
  gpt_torch.py step [options]
      time training steps in PyTorch eager (AdamW, clipping) on random windows of the text, one
      process, or --world N ranks under DistributedDataParallel (gloo); the median step time goes
      to a line 'result step_ms=...'. `make bench` puts it beside ch12_gpt.
  gpt_torch.py train [options]
      train as nanoGPT's train.py does with its Shakespeare setting (random windows drawn with
      replacement, its learning-rate schedule, AdamW, clipping at 1.0), in one process on the
      batch of --world ranks x --batch-size sequences, then print the held-out loss on the windows
      ch12_gpt --nproc WORLD --batch-size B --eval-all 1 evaluates: a line 'result val=... whole=...'.
      bench/gpt_quality.sh puts it beside ch12_gpt over several seeds.

Options: --layers --heads --width --ctx --batch-size --eval-batches --world --data --steps --threads
         --device cpu|cuda (step: PyTorch eager on one GPU)  --seed (train)
"""
import argparse
import json
import math
import os
import struct
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, width, heads, ctx):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)
        # not a parameter, and not saved: the state_dict holds the weights only
        self.register_buffer("mask", torch.tril(torch.ones(ctx, ctx)).view(1, 1, ctx, ctx), persistent=False)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)
        att = att.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf")).softmax(dim=-1)
        return self.c_proj((att @ v).transpose(1, 2).contiguous().view(b, t, c))


class MLP(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.c_fc = nn.Linear(width, 4 * width)
        self.c_proj = nn.Linear(4 * width, width)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, width, heads, ctx):
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads, ctx)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = MLP(width)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab, ctx, layers, heads, width):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, width),
            wpe=nn.Embedding(ctx, width),
            h=nn.ModuleList([Block(width, heads, ctx) for _ in range(layers)]),
            ln_f=nn.LayerNorm(width)))
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied, as in GPT-2
        for name, p in self.named_parameters():  # GPT-2's start (nanoGPT's _init_weights)
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers))
            elif p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(t))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def read_safetensors(path):
    """{name: tensor} of a safetensors file (F32 only, which is what ddp.h writes)."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", name
        a, b = info["data_offsets"]
        out[name] = torch.frombuffer(bytearray(blob[8 + n + a:8 + n + b]), dtype=torch.float32).view(info["shape"])
    return out


def load_text(path):
    data = open(path, "rb").read()
    chars = sorted(set(data))
    index = {c: i for i, c in enumerate(chars)}
    return torch.tensor([index[c] for c in data], dtype=torch.long), len(chars)


def windows(ids, starts, ctx):
    """Inputs and targets of the windows of ctx characters that begin at `starts`."""
    return (torch.stack([ids[s:s + ctx] for s in starts]), torch.stack([ids[s + 1:s + ctx + 1] for s in starts]))


def adamw(model):
    """nanoGPT's optimizer for the Shakespeare setting: weight decay on the 2-D tensors only."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                             lr=1e-3, betas=(0.9, 0.99))


def estimate_loss(model, ids, lo, hi, nb, world, batch, ctx):
    """The mean of the batch losses over the windows examples/ch12_gpt.c's estimate_loss reads."""
    nb = (nb + world - 1) // world * world
    stride = max(1, (hi - lo - ctx - 1) // (nb * batch))
    losses = []
    with torch.no_grad():
        for e in range(nb):
            x, y = windows(ids, [min(lo + (e * batch + i) * stride, hi - ctx - 1) for i in range(batch)], ctx)
            losses.append(model(x, y).item())
    return sum(losses) / len(losses)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["check", "step", "train"])
    ap.add_argument("snapshot", nargs="?")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--ctx", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=12)
    ap.add_argument("--eval-batches", type=int, default=20)
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (step: one process on one GPU)")
    ap.add_argument("--seed", type=int, default=1337, help="train: torch.manual_seed, as nanoGPT's")
    ap.add_argument("--data", default=os.path.join(os.path.dirname(__file__), "..", "examples", "data",
                                                   "tinyshakespeare.txt"))
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    ids, vocab = load_text(a.data)
    ntrain = len(ids) * 9 // 10
    model = GPT(vocab, a.ctx, a.layers, a.heads, a.width)
    if a.mode == "check":
        saved = {k: v for k, v in read_safetensors(a.snapshot).items() if not k.startswith("optim.")}
        saved["lm_head.weight"] = saved["transformer.wte.weight"]  # one tensor under both names, as nanoGPT's
        model.load_state_dict(saved, strict=True)
        model.eval()
        tr = estimate_loss(model, ids, 0, ntrain, a.eval_batches, a.world, a.batch_size, a.ctx)
        va = estimate_loss(model, ids, ntrain, len(ids), a.eval_batches, a.world, a.batch_size, a.ctx)
        print("train loss %.6f, val loss %.6f (%d tensors loaded with strict=True)" % (tr, va, len(saved)))
        return 0
    if a.mode == "train":
        return train_like_nanogpt(a, ids, ntrain, vocab)
    if a.world > 1:
        import torch.multiprocessing as mp
        port = 20000 + os.getpid() % 20000
        mp.spawn(train_steps, args=(a, ids, ntrain, vocab, port), nprocs=a.world, join=True)
    else:
        train_steps(0, a, ids, ntrain, vocab, None)
    return 0


def train_like_nanogpt(a, ids, ntrain, vocab):
    """nanoGPT's train.py loop with config/train_shakespeare_char.py and its laptop overrides (lr 1e-3
    down to 1e-4 along a cosine after 100 warmup steps, betas (0.9, 0.99), weight decay 0.1 on the
    2-D tensors, clipping at 1.0, no dropout), with --world x --batch-size windows per step drawn at
    random with replacement. The held-out loss is then taken on ch12_gpt's windows for --world
    ranks of --batch-size: its --eval-batches estimate and its --eval-all whole text."""
    torch.manual_seed(a.seed)
    model = GPT(vocab, a.ctx, a.layers, a.heads, a.width)
    opt = adamw(model)
    warmup, lr, min_lr, batch = 100, 1e-3, 1e-4, a.world * a.batch_size
    t0 = time.perf_counter()
    for it in range(a.steps):
        if it < warmup:  # nanoGPT's get_lr, with lr_decay_iters = max_iters
            now = lr * (it + 1) / (warmup + 1)
        else:
            now = min_lr + 0.5 * (1.0 + math.cos(math.pi * (it - warmup) / max(1, a.steps - warmup))) * (lr - min_lr)
        for group in opt.param_groups:
            group["lr"] = now
        x, y = windows(ids, torch.randint(ntrain - a.ctx, (batch,)), a.ctx)
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if (it + 1) % 500 == 0:
            print("step %d/%d  loss %.4f" % (it + 1, a.steps, loss.item()), flush=True)
    model.eval()
    va = estimate_loss(model, ids, ntrain, len(ids), a.eval_batches, a.world, a.batch_size, a.ctx)
    every = (len(ids) - ntrain - a.ctx - 1) // (a.ctx * a.batch_size)
    whole = estimate_loss(model, ids, ntrain, len(ids), every, a.world, a.batch_size, a.ctx)
    print("result val=%.4f whole=%.4f steps=%d seed=%d minutes=%.1f" % (va, whole, a.steps, a.seed,
                                                                        (time.perf_counter() - t0) / 60), flush=True)
    return 0


def train_steps(rank, a, ids, ntrain, vocab, port):
    """Timed training steps on random windows; under DDP (gloo) when port is set. Rank 0 prints
    'result step_ms=... median of N steps'."""
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    dev = torch.device(a.device)
    model = GPT(vocab, a.ctx, a.layers, a.heads, a.width).to(dev)
    net = model
    if port is not None:
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=a.world)
        net = torch.nn.parallel.DistributedDataParallel(model)
    opt = adamw(model)
    g = torch.Generator().manual_seed(1 + rank)
    times = []
    for step in range(a.steps):
        x, y = windows(ids, torch.randint(0, ntrain - a.ctx - 1, (a.batch_size,), generator=g), a.ctx)
        x, y = x.to(dev), y.to(dev)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = net(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize()  # the step's kernels done, not only queued
        times.append(time.perf_counter() - t0)
    times = sorted(times[2:]) or times
    if rank == 0:
        print("result step_ms=%.3f steps=%d world=%d threads=%d loss=%.4f" % (
            times[len(times) // 2] * 1e3, len(times), a.world, torch.get_num_threads(), loss.item()), flush=True)
    if port is not None:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
