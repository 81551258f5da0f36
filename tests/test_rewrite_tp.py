"""Tensor / sequence parallel + recompute rewrite, checked numerically against the serial rows.

One ``torch.multiprocessing.spawn`` of 2 gloo ranks checks every row kind (gpt block with fused
qkv, llama block with GQA / RoPE / SwiGLU, a user's nanoGPT-style block, embedding, head) with
sequence parallel off and on and each recompute setting: outputs, input gradients and (gathered)
parameter gradients equal the serial module's within 1e-5 relative (fp32).
"""
from __future__ import annotations

import math
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from world_prefetch import Job, result

TP = 2
RTOL = 1e-5


# ---- a user's nanoGPT-style block (Karpathy's code, flash and math attention) ----------------------

class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, block_size, flash):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=True)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=True)
        self.attn_dropout = nn.Dropout(0.0)
        self.resid_dropout = nn.Dropout(0.0)
        self.n_head, self.n_embd, self.flash = n_head, n_embd, flash
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size))
                             .view(1, 1, block_size, block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        if self.flash:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            att = self.attn_dropout(att)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class LayerNorm(nn.Module):
    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, input):
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)


class MLP(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * n_embd, n_embd)
        self.dropout = nn.Dropout(0.0)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, n_embd=32, n_head=4, block_size=8, flash=True):
        super().__init__()
        self.ln_1 = LayerNorm(n_embd, bias=True)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size, flash)
        self.ln_2 = LayerNorm(n_embd, bias=True)
        self.mlp = MLP(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


# ---- a timm-style ViT block: fused qkv reshaped to (B, N, 3, H, D), then unbind ------------------

class TimmAttention(nn.Module):
    def __init__(self, dim=32, num_heads=4):
        super().__init__()
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = (q @ k.transpose(-2, -1)) * self.scale
        attn = attn.softmax(dim=-1)
        x = (attn @ v).transpose(1, 2).reshape(B, N, C)
        return self.proj(x)


class TimmBlock(nn.Module):
    def __init__(self, dim=32):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = TimmAttention(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1, self.act, self.fc2 = nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.fc2(self.act(self.fc1(self.norm2(x))))


# ---- cases --------------------------------------------------------------------------------------

GPT = "gpt:layers=1,hidden=32,heads=4,vocab=64,seq=8"
LLAMA = "llama:layers=1,hidden=32,heads=4,kv_heads=2,ffn=64,vocab=64,seq=8"
GPT_ODD_VOCAB = "gpt:layers=1,hidden=32,heads=4,vocab=63,seq=8"
BERT = "bert:layers=1,hidden=32,heads=4,vocab=64,seq=8"
MLPF = "mlp:layers=1,hidden=32,classes=10,seq=8"
GPT_DROPOUT = "gpt:layers=1,hidden=32,heads=4,vocab=64,seq=8,dropout=0.2"


def _randomize(module: nn.Module, seed: int):
    """Non-trivial norms / biases so their gradients are checked too."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2 + (1.0 if p.dim() == 1 else 0.0))
    return module


def build_case(name: str):
    from autopar.models import load_model
    if name == "gpt_block":
        return _randomize(load_model(GPT).build("cpu").blocks[0], 1), "block"
    if name == "llama_block":
        return _randomize(load_model(LLAMA).build("cpu").blocks[0], 2), "block"
    if name == "user_block_flash":
        torch.manual_seed(0)
        return _randomize(Block(flash=True), 3), "block"
    if name == "user_block_math":
        torch.manual_seed(0)
        return _randomize(Block(flash=False), 4), "block"
    if name == "gpt_flash_block":
        return _randomize(load_model(GPT).build("cpu", attention="flash").blocks[0], 11), "block"
    if name == "bert_block":   # post-norm: the attention input is also the residual
        return _randomize(load_model(BERT).build("cpu").blocks[0], 12), "block"
    if name == "mlp_block":
        return _randomize(load_model(MLPF).build("cpu").blocks[0], 13), "block"
    if name == "dropout_block":     # dropout > 0: the shards use the serial model's masks
        return _randomize(load_model(GPT_DROPOUT).build("cpu").blocks[0], 15), "block"
    if name == "dropout_embedding":
        return _randomize(load_model(GPT_DROPOUT).build("cpu").embedding, 16), "embedding"
    if name == "timm_block":
        torch.manual_seed(0)
        return _randomize(TimmBlock(), 14), "block"
    if name == "gpt_embedding":
        return _randomize(load_model(GPT).build("cpu").embedding, 5), "embedding"
    if name == "gpt_head":
        return _randomize(load_model(GPT).build("cpu").head, 6), "head"
    if name == "llama_embedding":
        return _randomize(load_model(LLAMA).build("cpu").embedding, 7), "embedding"
    if name == "llama_head":
        return _randomize(load_model(LLAMA).build("cpu").head, 8), "head"
    if name == "odd_vocab_embedding":
        return _randomize(load_model(GPT_ODD_VOCAB).build("cpu").embedding, 9), "embedding"
    if name == "odd_vocab_head":
        return _randomize(load_model(GPT_ODD_VOCAB).build("cpu").head, 10), "head"
    raise KeyError(name)


CASES = ["gpt_block", "gpt_flash_block", "llama_block", "bert_block", "mlp_block", "timm_block", "dropout_block",
         "dropout_embedding", "user_block_flash", "user_block_math", "gpt_embedding",
         "gpt_head", "llama_embedding", "llama_head", "odd_vocab_embedding", "odd_vocab_head"]
SETTINGS = [(sp, rc) for sp in (False, True) for rc in ("none", "selective", "full")]
# the rows the brief names get every setting; the extra coverage rows a lighter subset
FULL_MATRIX = {"gpt_block", "llama_block", "user_block_flash", "user_block_math", "gpt_embedding", "gpt_head"}
LIGHT = [(False, "none"), (True, "selective"), (True, "full")]


def _rel(a, b):
    return (a - b).abs().max().item() / max(b.abs().max().item(), 1e-12)


def check_case(name, sp, rc, rank, group):
    from autopar.rewrite import gather_row_state_dict, rewrite_row
    serial, kind = build_case(name)
    local_src, _ = build_case(name)   # built identically on every rank
    g = torch.Generator().manual_seed(123)
    if kind == "embedding":
        x = torch.randint(0, serial_vocab(serial), (2, 8), generator=g)
    else:
        x = torch.randn(2, 8, 32, generator=g)
    gm = rewrite_row(local_src, kind=kind, tp_rank=rank, tp_size=TP, tp_group=group,
                     sequence_parallel=sp, recompute=rc, example_input=x)
    # serial
    xs = x.clone().requires_grad_(x.is_floating_point())
    torch.manual_seed(777)   # same RNG state for the serial and the sharded forward (dropout)
    ys = serial(xs)
    G = torch.randn(ys.shape, generator=g)
    (ys * G).sum().backward()
    # local: SP blocks / heads take the sequence shard; SP blocks / embeddings return one
    xin = x.chunk(TP, dim=1)[rank] if (sp and kind in ("block", "head")) else x
    xl = xin.clone().requires_grad_(x.is_floating_point())
    torch.manual_seed(777)
    yl = gm(xl)
    split_out = sp and kind in ("block", "embedding")
    want = ys.chunk(TP, dim=1)[rank] if split_out else ys
    Gl = G.chunk(TP, dim=1)[rank] if split_out else G
    errs = []
    if yl.shape != want.shape:
        return [f"output shape {tuple(yl.shape)} != {tuple(want.shape)}"]
    if _rel(yl.detach(), want.detach()) > RTOL:
        errs.append(f"output differs by {_rel(yl.detach(), want.detach()):.2e}")
    (yl * Gl).sum().backward()
    if x.is_floating_point():
        gx = xs.grad.chunk(TP, dim=1)[rank] if (sp and kind in ("block", "head")) else xs.grad
        if _rel(xl.grad, gx) > RTOL:
            errs.append(f"input grad differs by {_rel(xl.grad, gx):.2e}")
    grads = gather_row_state_dict(gm, group, grads=True)
    for pname, p in serial.named_parameters():
        if pname not in grads:
            errs.append(f"no gradient for {pname}")
            continue
        if grads[pname].shape != p.grad.shape or _rel(grads[pname], p.grad) > RTOL:
            errs.append(f"grad of {pname} differs ({tuple(grads[pname].shape)} vs {tuple(p.grad.shape)}, "
                        f"{_rel(grads[pname], p.grad) if grads[pname].shape == p.grad.shape else 'shape'})")
    full = gather_row_state_dict(gm, group)
    for pname, p in serial.state_dict().items():
        if pname in full and not torch.equal(full[pname], p):
            errs.append(f"gathered state {pname} differs from the serial weight")
    return errs


def serial_vocab(emb):
    return next(m for m in emb.modules() if isinstance(m, nn.Embedding)).num_embeddings


def _rank_failures():
    """One rank's failures over every case (runs under autopar.runtime.verify.serial.spawn, which
    keeps a rank's result when gloo aborts in its teardown after the result was written)."""
    from autopar.runtime.faults import dist as adist
    torch.set_num_threads(1)
    adist.ensure_initialized(TP)
    rank = dist.get_rank()
    group = dist.new_group([0, 1])
    failures = []
    for name in CASES:
        for sp, rc in (SETTINGS if name in FULL_MATRIX else LIGHT):
            try:
                errs = check_case(name, sp, rc, rank, group)
            except Exception:  # noqa: BLE001
                errs = [traceback.format_exc(limit=6)]
            failures += [f"{name} sp={sp} recompute={rc}: {e}" for e in errs]
    return failures


@pytest.mark.slow
def _tp_world():
    from autopar.runtime.verify.serial import spawn
    return spawn(_rank_failures, TP)


# the 2-rank world runs ahead in the suite's prefetch helper (tests/world_prefetch.py)
PREFETCH_WORLD = Job(_tp_world)


def test_tp2_rows_match_serial():
    per_rank = result(__name__, PREFETCH_WORLD)
    failures = [f"rank {r}: {line}" for r, lines in enumerate(per_rank) for line in lines]
    assert not failures, "\n".join(failures[:40])
