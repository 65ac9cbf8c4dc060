"""GPT-2: token + learned position embeddings, pre-LayerNorm transformer blocks,
a final LayerNorm and a language-model head tied to the token embedding.

Module names follow OpenAI's / Hugging Face's GPT-2 checkpoints (transformer.wte,
h.N.attn.c_attn, ...) so their weights map onto this model name for name.

ModelConfig can swap in the parts of today's fast small-model recipes, each off by
default: rotary positions (Su et al., RoFormer) in place of the learned ones, RMSNorm,
QK-norm, a ReLU^2 MLP, an untied head, zero-initialised output projections and soft-capped
logits; and the speedrun's further parts: value embeddings (gpt/model/value_embeds.py), U-net
skips (gpt/model/unet.py), and a growing sliding window and document masks for attention
(gpt/model/attention_mask.py). A block is composed from the chosen parts when it is built
(norm(), MLP.act, the attention's qk_parts and value_mix, GPT's value_embeds, skips and
attn_mask), so forward() reads the same either way."""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from gpt.core.config import ModelConfig
from gpt.model import attention
from gpt.model.attention_mask import AttentionMask, CausalOnly, masked
from gpt.model.kv_cache import KVCache
from gpt.model.loss_kernels import ExpectedGrad, fused, loss_fn
from gpt.model.unet import skips
from gpt.model.value_embeds import ValueMix, table_of, value_embeddings


def norm(cfg: ModelConfig, dim: int) -> nn.Module:
    """The block's normalisation: LayerNorm (GPT-2) or RMSNorm (no mean, no bias)."""
    return nn.RMSNorm(dim) if cfg.rmsnorm else nn.LayerNorm(dim)


class QKNorm(nn.Module):
    """Each head's queries and keys scaled to unit RMS (no gain), which bounds the
    attention logits and lets a higher learning rate train stably."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        return F.rms_norm(q, (q.size(-1),)), F.rms_norm(k, (k.size(-1),))


class Rotary(nn.Module):
    """Rotary position embedding: channel i of a head's first half and channel i of its
    second half are rotated together by the angle position * base^(-2i / head_dim), so a
    query-key product depends on their positions' difference only. Positions start at
    `start` (the KV cache's length), so cached keys keep the angle of their own position.
    The angles are computed on the fly in fp32: no buffer to keep, shard or checkpoint."""

    def __init__(self, base: float = 10000.0) -> None:
        super().__init__()
        self.base = base

    def forward(self, q: torch.Tensor, k: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        T, D = q.size(2), q.size(3)
        inv_freq = self.base ** (-torch.arange(0, D, 2, device=q.device, dtype=torch.float32) / D)
        pos = torch.arange(start, start + T, device=q.device, dtype=torch.float32)
        angles = torch.outer(pos, inv_freq)  # (T, D/2)
        cos, sin = angles.cos(), angles.sin()
        return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).type_as(x)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int = 0) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.n_embd = cfg.n_embd
        self.dropout = cfg.dropout
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)  # q, k, v in one matmul
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.c_proj.residual_scale = True  # type: ignore[attr-defined]  # see GPT._init_module
        self.c_proj.zero_init = cfg.zero_init_proj  # type: ignore[attr-defined]
        self.resid_dropout = nn.Dropout(cfg.dropout)
        # What happens to queries and keys before attention, in order (none for GPT-2)
        parts: list[nn.Module] = ([QKNorm()] if cfg.qk_norm else []) + ([Rotary()] if cfg.rotary else [])
        self.qk_parts = nn.ModuleList(parts)
        # Mixes a value embedding into the values (only blocks that have one: gpt/model/value_embeds.py)
        self.value_mix = ValueMix() if table_of(cfg, layer) is not None else None

    def forward(
        self, x: torch.Tensor, kv_cache: KVCache | None = None, layer: int = 0,
        mask: object = None, ve: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """mask: which keys each query may see (None: causal only); ve: this block's value
        embedding, for a block with a value_mix."""
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        # (B, T, C) -> (B, heads, T, head_dim)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        for part in self.qk_parts:
            q, k = part(q, k, 0 if kv_cache is None else kv_cache.length)
        if self.value_mix is not None and ve is not None:
            v = self.value_mix(v, ve.view(B, T, self.n_head, C // self.n_head).transpose(1, 2))
        dropout_p = self.dropout if self.training else 0.0
        if mask is not None:  # a window or documents (gpt/model/attention_mask.py): over all keys
            if kv_cache is not None:
                k, v = kv_cache.update(layer, k, v)
            y = attention.masked(q, k, v, mask, dropout_p)
        elif kv_cache is None:
            y = attention.causal(q, k, v, dropout_p)
        else:  # the new queries over the cached keys and their own
            start = kv_cache.length
            k, v = kv_cache.update(layer, k, v)
            y = attention.after_prefix(q, k, v, start, dropout_p)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class ReLU2(nn.Module):
    """relu(x)^2: as good as GELU or better for small LMs (Primer, So et al.), and cheaper."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x).square()


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        # GELU with the tanh approximation GPT-2 was trained with, or ReLU^2
        self.act = ReLU2() if cfg.relu2 else nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)
        self.c_proj.residual_scale = True  # type: ignore[attr-defined]
        self.c_proj.zero_init = cfg.zero_init_proj  # type: ignore[attr-defined]
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))


class Block(nn.Module):
    """Pre-norm block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: ModelConfig, layer: int = 0) -> None:
        super().__init__()
        self.ln_1 = norm(cfg, cfg.n_embd)
        self.attn = CausalSelfAttention(cfg, layer)
        self.ln_2 = norm(cfg, cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(
        self, x: torch.Tensor, kv_cache: KVCache | None = None, layer: int = 0,
        mask: object = None, ve: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), kv_cache, layer, mask, ve)
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        # How loss() computes the loss (not part of the model: checkpoints do not hold
        # it). Off here, so a GPT built directly computes exactly F.cross_entropy of its
        # logits; the trainer turns it on with --chunked-loss (gpt.engine.parallel.parallelize).
        self.chunked_loss = False
        # whose fused head + loss (gpt.model.loss_kernels), if chunked; "fused": the whole logits'
        # loss in gpt.model.fused_ce's kernels
        self.loss_kernel = "ours"
        # the fused loss's forward mode: the incoming gradient it expects, one a model
        self.expected_grad = ExpectedGrad()
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(cfg.vocab_size, cfg.n_embd),
                # learned positions (GPT-2); rotary ones live in the attention instead
                **({} if cfg.rotary else {"wpe": nn.Embedding(cfg.block_size, cfg.n_embd)}),
                drop=nn.Dropout(cfg.dropout),
                h=nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layer)),
                ln_f=norm(cfg, cfg.n_embd),
            )
        )
        # The speedrun's further parts; with them off, modules without weights that change nothing
        self.value_embeds = value_embeddings(cfg)
        self.skips = skips(cfg)
        self.attn_mask = AttentionMask(cfg) if masked(cfg) else CausalOnly()
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.untied_head:
            self.lm_head.zero_init = cfg.zero_init_proj  # type: ignore[attr-defined]
        else:
            # Weight tying: the output projection is the token embedding (saves V x d
            # params, and is what GPT-2 did).
            self.lm_head.weight = self.transformer.wte.weight
        if self.lm_head.weight.device.type != "meta":  # on meta, init_weights() comes later
            with torch.no_grad():
                for module in _post_order(self):  # the order nn.Module.apply visits them
                    self._init_module(module)

    def _init_module(self, module: nn.Module, device: str | None = None) -> None:
        """GPT-2's initialisation of one module, its random values drawn on `device`
        (default: where the weight is): N(0, 0.02) for matmul weights and embeddings
        (less for the projections into the residual stream), zero biases, unit gains."""
        if isinstance(module, nn.Linear):
            std = 0.02
            if getattr(module, "residual_scale", False):
                # Each block adds two outputs to the residual stream; scaling their init
                # keeps the stream's variance from growing with depth.
                std *= (2 * self.config.n_layer) ** -0.5
            _fill_normal(module.weight, std, device)
            if getattr(module, "zero_init", False):  # drawn all the same: one RNG sequence
                module.weight.zero_()
            if module.bias is not None:
                module.bias.zero_()
        elif isinstance(module, nn.Embedding):
            _fill_normal(module.weight, 0.02, device)
        elif isinstance(module, nn.LayerNorm):
            module.weight.fill_(1.0)
            module.bias.zero_()
        elif isinstance(module, nn.RMSNorm):
            module.weight.fill_(1.0)
        elif hasattr(module, "init_values"):  # a part's own scalars (value_mix, skips, mask)
            module.init_values()

    @torch.no_grad()
    def init_weights(self) -> None:
        """Initialise a model built on the meta device and materialised since (to_empty,
        maybe sharded first) to exactly the weights GPT(cfg) built on the CPU gets from the
        same seed: the values are drawn from the CPU generator, one tensor at a time, in
        the same order, and copied into the parameters wherever they live. (GPT(cfg) on
        the CPU draws first in the layers' own constructors, then in GPT-2's init, which
        ties the head last; both are replayed.) So no rank ever holds the whole model on
        the host, and a seed gives the same model on any device, sharded or not."""
        for module in self.modules():  # the constructors' default inits, in build order
            if isinstance(module, nn.Linear):
                nn.Linear(module.in_features, module.out_features, bias=module.bias is not None,
                          device="cpu")
            elif isinstance(module, nn.Embedding):
                nn.Embedding(module.num_embeddings, module.embedding_dim, device="cpu")
        for module in _post_order(self):  # the order nn.Module.apply visits them
            self._init_module(module, "cpu")

    def to_empty(self, *, device: torch.device | str | None, recurse: bool = True) -> "GPT":
        """nn.Module.to_empty, with the head tied to the embedding again (moving a
        meta-device model gives each module a tensor of its own) and the attention window
        at its first step's value."""
        super().to_empty(device=device, recurse=recurse)
        if not self.config.untied_head:
            self.lm_head.weight = self.transformer.wte.weight
        if isinstance(self.attn_mask, AttentionMask):  # a buffer no state dict restores
            self.attn_mask.init_values()
        return self

    def num_params(self, exclude_position_embedding: bool = False) -> int:
        """Parameter count, tied weights counted once."""
        n = sum(p.numel() for p in self.parameters())  # parameters() yields a tied tensor once
        if exclude_position_embedding and "wpe" in self.transformer:
            n -= self.transformer.wpe.weight.numel()
        return n

    def new_kv_cache(self, max_len: int | None = None) -> KVCache:
        """An empty KVCache for up to max_len positions (default: the block size)."""
        max_len = self.config.block_size if max_len is None else max_len
        if max_len > self.config.block_size:
            raise ValueError(f"KV cache max_len {max_len} exceeds block_size {self.config.block_size}")
        return KVCache(self.config.n_layer, max_len)

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """idx: (B, T) token ids. Returns (logits (B, T, V), None) without targets, and
        (None, mean cross-entropy) with targets (B, T) of any layout: a training step never
        holds the full logits past the loss.

        Without kv_cache (training, evaluation) this is one causal pass over idx. With a
        KVCache, idx continues the cached sequence: its tokens take positions
        kv_cache.length onwards, attend to the cached keys too, and are appended to the cache.
        """
        B, T = idx.shape
        start = 0 if kv_cache is None else kv_cache.length
        if start + T > self.config.block_size:
            what = f"sequence length {T}" if start == 0 else f"{start} cached + {T} new positions"
            raise ValueError(f"{what} exceeds the model's block_size {self.config.block_size}")
        x = self.transformer.wte(idx)
        if "wpe" in self.transformer:  # learned positions; rotary ones are the attention's
            x = x + self.transformer.wpe(torch.arange(start, start + T, device=idx.device))
        x = self.transformer.drop(x)
        mask, ves = self.attn_mask(idx, kv_cache), self.value_embeds(idx)
        outputs: list[torch.Tensor] = []
        for i, block in enumerate(self.transformer.h):
            x = block(self.skips(i, x, outputs), kv_cache, i, mask, ves[i])
            outputs.append(x)
        if kv_cache is not None:
            kv_cache.length += T
        if targets is None:
            return self.logits(x), None
        return None, self.loss(x, targets)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The final norm and the head; soft-capped if configured (in fp32: a bf16 tanh
        near the cap would round many logits to the same value)."""
        logits = self.lm_head(self.transformer.ln_f(x))
        cap = self.config.logit_softcap
        return cap * torch.tanh(logits.float() / cap) if cap else logits

    def loss(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of the last block's output x (B, T, C) against targets: the
        final LayerNorm, the head and the loss, which can be compiled on their own (under
        FSDP the root module's own code runs eagerly; see gpt.engine.parallel). With
        chunked_loss the head and the loss run fused, a chunk of rows at a time
        (gpt.model.chunked_ce, or a library's kernel: gpt.model.loss_kernels): the same loss and
        gradients without ever holding the logits. With loss_kernel "fused" the whole
        logits' loss runs in gpt.model.fused_ce's Triton kernels (CUDA)."""
        if self.chunked_loss:
            return loss_fn(self.loss_kernel)(self.transformer.ln_f(x), self.lm_head.weight,
                                             targets, self.config.logit_softcap)
        if self.loss_kernel == "fused":  # the whole logits, the cap and loss in one kernel's fp32
            return fused(self.lm_head(self.transformer.ln_f(x)), targets,
                         self.config.logit_softcap, self.expected_grad)
        logits = self.logits(x)
        # Under autocast cross_entropy runs in fp32, so bf16 logits lose no accuracy here.
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def _post_order(module: nn.Module) -> Iterator[nn.Module]:
    """Every submodule, children before their parent: the order nn.Module.apply visits."""
    for child in module.children():
        yield from _post_order(child)
    yield module


def _fill_normal(param: torch.Tensor, std: float, device: str | torch.device | None) -> None:
    """param <- N(0, std) drawn as one tensor of its full shape on `device` (default: the
    parameter's), then copied in: the same draws as nn.init.normal_ on such a tensor."""
    values = torch.empty(param.shape, dtype=param.dtype, device=device or param.device)
    param.copy_(values.normal_(0.0, std))


def unwrap(model: nn.Module) -> nn.Module:
    """The model under torch.compile's and DDP's wrappers: the one place that peels them.
    (FSDP2 shards a module in place, so there is nothing to peel there.)"""
    while True:
        if isinstance(model, DistributedDataParallel):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), nn.Module):  # torch.compile
            model = model._orig_mod
        else:
            return model
