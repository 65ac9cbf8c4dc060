"""A gpt2-trainer model beyond GPT-2, for transformers.

An export folder carries this file and configuration_gpt_trainer.py; config.json's auto_map
names them, so AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True),
generate(), pipeline("text-generation") and lm-eval's hf model load the folder. It imports
only torch and transformers.

The forward pass is the trainer's own at inference, operation for operation, under the
trainer's parameter names (transformer.wte, transformer.h.N.attn.c_attn, lm_head, ...):
pre-norm blocks of attention and a 4x MLP, with the options config.json names. generate()
keeps a KV cache. A left-padded row (attention_mask) gets the positions it would have
unpadded, so a batch computes what each row computes alone.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import DynamicCache, GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_gpt_trainer import GPTTrainerConfig

# The KV cache's argument and output field: "cache" from transformers 5.2x, "past_key_values" before
CACHE = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
ROTARY_BASE = 10000.0


def norm(config: GPTTrainerConfig) -> nn.Module:
    return nn.RMSNorm(config.n_embd) if config.rmsnorm else nn.LayerNorm(config.n_embd)


def value_tables(config: GPTTrainerConfig) -> int:
    """Value embedding tables: min(3, n_layer // 2), block i of the first k reading table i
    and block n_layer - k + i of the last k reading it again."""
    return min(3, config.n_layer // 2) if config.value_embeds else 0


def table_of(config: GPTTrainerConfig, layer: int):
    k = value_tables(config)
    if layer < k:
        return layer
    if layer >= config.n_layer - k:
        return layer - (config.n_layer - k)
    return None


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Channel i of a head's first half turns with channel i of its second half, in fp32."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).type_as(x)


class ValueMix(nn.Module):
    """v <- a * v + b * ve, two learned scalars of one block."""

    def __init__(self) -> None:
        super().__init__()
        self.weights = nn.Parameter(torch.full((2,), 0.5))

    def forward(self, v: torch.Tensor, ve: torch.Tensor) -> torch.Tensor:
        a, b = self.weights.to(v.dtype).unbind()
        return a * v + b * ve.view_as(v)


class GPTTrainerAttention(nn.Module):
    def __init__(self, config: GPTTrainerConfig, layer: int) -> None:
        super().__init__()
        self.layer, self.n_head, self.dropout = layer, config.n_head, config.dropout
        self.qk_norm = config.qk_norm
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.value_mix = ValueMix() if table_of(config, layer) is not None else None

    def forward(self, x, rope, mask, cache, ve):
        """mask: a boolean (B or 1, 1, T, S) tensor of the keys each query may see, or True
        for plain causal attention over the T new positions, or False for none (one new
        position after the cached ones)."""
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if self.qk_norm:  # unit RMS per head, no gain
            q, k = F.rms_norm(q, (q.size(-1),)), F.rms_norm(k, (k.size(-1),))
        if rope is not None:
            q, k = rotate(q, *rope), rotate(k, *rope)
        if self.value_mix is not None:
            v = self.value_mix(v, ve.view(B, T, self.n_head, C // self.n_head).transpose(1, 2))
        if cache is not None:
            k, v = cache.update(k, v, self.layer)
        p = self.dropout if self.training else 0.0
        if isinstance(mask, torch.Tensor):
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=mask, dropout_p=p)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))


class GPTTrainerMLP(nn.Module):
    def __init__(self, config: GPTTrainerConfig) -> None:
        super().__init__()
        self.relu2 = config.relu2
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.c_fc(x)
        h = F.relu(h).square() if self.relu2 else F.gelu(h, approximate="tanh")
        return self.dropout(self.c_proj(h))


class GPTTrainerBlock(nn.Module):
    def __init__(self, config: GPTTrainerConfig, layer: int) -> None:
        super().__init__()
        self.ln_1 = norm(config)
        self.attn = GPTTrainerAttention(config, layer)
        self.ln_2 = norm(config)
        self.mlp = GPTTrainerMLP(config)

    def forward(self, x, rope, mask, cache, ve):
        x = x + self.attn(self.ln_1(x), rope, mask, cache, ve)
        return x + self.mlp(self.ln_2(x))


class ValueEmbeddings(nn.Module):
    def __init__(self, config: GPTTrainerConfig) -> None:
        super().__init__()
        self.layers = [table_of(config, i) for i in range(config.n_layer)]
        self.tables = nn.ModuleList(nn.Embedding(config.vocab_size, config.n_embd)
                                    for _ in range(value_tables(config)))

    def forward(self, idx: torch.Tensor) -> list:
        looked_up = [table(idx) for table in self.tables]
        return [None if t is None else looked_up[t] for t in self.layers]


class UNetSkips(nn.Module):
    """Block n_layer - 1 - i of the second half also gets block i's output, times a weight."""

    def __init__(self, config: GPTTrainerConfig) -> None:
        super().__init__()
        self.n_layer, self.pairs = config.n_layer, config.n_layer // 2
        self.weights = nn.Parameter(torch.ones(self.pairs))

    def forward(self, layer: int, x: torch.Tensor, outputs: list) -> torch.Tensor:
        first_late = self.n_layer - self.pairs
        if layer < first_late:
            return x
        return x + self.weights[layer - first_late].to(x.dtype) * outputs[self.n_layer - 1 - layer]


class GPTTrainerPreTrainedModel(PreTrainedModel):
    config_class = GPTTrainerConfig
    base_model_prefix = "transformer"
    _no_split_modules = ["GPTTrainerBlock"]
    _supports_cache_class = True

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, ValueMix):
            module.weights.data.fill_(0.5)
        elif isinstance(module, UNetSkips):
            module.weights.data.fill_(1.0)
        elif isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.data.normal_(0.0, self.config.initializer_range)
            if getattr(module, "bias", None) is not None:
                module.bias.data.zero_()
        elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
            module.weight.data.fill_(1.0)
            if getattr(module, "bias", None) is not None:
                module.bias.data.zero_()


class GPTTrainerForCausalLM(GPTTrainerPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "transformer.wte.weight"}  # if tie_word_embeddings

    def __init__(self, config: GPTTrainerConfig) -> None:
        super().__init__(config)
        parts = {"wte": nn.Embedding(config.vocab_size, config.n_embd)}
        if not config.rotary:  # learned positions
            parts["wpe"] = nn.Embedding(config.block_size, config.n_embd)
        parts.update(drop=nn.Dropout(config.dropout),
                     h=nn.ModuleList(GPTTrainerBlock(config, i) for i in range(config.n_layer)),
                     ln_f=norm(config))
        self.transformer = nn.ModuleDict(parts)
        self.value_embeds = ValueEmbeddings(config) if config.value_embeds else None
        self.skips = UNetSkips(config) if config.unet_skips else None
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.transformer.wte

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.transformer.wte = value

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Module) -> None:
        self.lm_head = value

    def prepare_inputs_for_generation(self, input_ids, past_key_values=None, cache=None,
                                      attention_mask=None, use_cache=None, **kwargs):
        """The tokens the cache has not seen; with doc_mask also all of them (context_ids),
        whose end-of-text tokens say which cached keys share a query's document."""
        cache = cache if cache is not None else past_key_values
        seen = cache.get_seq_length() if cache is not None else 0
        inputs = {"input_ids": input_ids[:, seen:], "attention_mask": attention_mask,
                  "use_cache": use_cache, CACHE: cache}
        if self.config.doc_mask:
            inputs["context_ids"] = input_ids
        return inputs

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None,
                past_key_values=None, use_cache=None, labels=None, context_ids=None,
                inputs_embeds=None, output_hidden_states=None, return_dict=None, **kwargs):
        """input_ids (B, T) continue the cache's positions, if any. attention_mask (B, cached
        + T): 0 at padding. context_ids (B, cached + T): every token so far, which doc_mask
        needs once a cache holds some. labels (B, T): the loss of predicting labels[:, 1:]."""
        if input_ids is None or inputs_embeds is not None:
            raise ValueError("this model takes token ids (input_ids), not inputs_embeds")
        cfg = self.config
        cache = cache if cache is not None else past_key_values
        use_cache = (cfg.use_cache if use_cache is None else use_cache) and not self.training
        if cache is not None and not hasattr(cache, "get_seq_length"):
            raise ValueError("pass the KV cache as a transformers Cache (DynamicCache), not tuples")
        if cache is None and use_cache:
            cache = DynamicCache()
        B, T = input_ids.shape
        seen = cache.get_seq_length() if cache is not None else 0
        S, device = seen + T, input_ids.device
        if S > cfg.block_size:
            raise ValueError(f"{S} positions exceed the model's context of {cfg.block_size} "
                             f"tokens (block_size)")
        if attention_mask is not None and attention_mask.shape[-1] != S:
            raise ValueError(f"attention_mask covers {attention_mask.shape[-1]} positions; "
                             f"the cache and input_ids make {S}")
        padded = attention_mask is not None and not bool(attention_mask.all())
        # A position counts the real tokens before it, so padding on the left shifts nothing
        key_pos = ((attention_mask.long().cumsum(-1) - 1).clamp(min=0) if padded
                   else torch.arange(S, device=device))
        query_pos = key_pos[..., seen:]
        pos = query_pos if position_ids is None else position_ids
        x = self.transformer.wte(input_ids)
        if "wpe" in self.transformer:
            x = x + self.transformer.wpe(pos)
        x = self.transformer.drop(x)
        rope = None
        if cfg.rotary:
            D = cfg.n_embd // cfg.n_head
            inv_freq = ROTARY_BASE ** (-torch.arange(0, D, 2, device=device, dtype=torch.float32) / D)
            angles = pos.float().unsqueeze(-1) * inv_freq  # (T, D/2), or (B, 1, T, D/2) per row
            angles = angles.unsqueeze(1) if angles.dim() == 3 else angles
            rope = (angles.cos(), angles.sin())
        mask = self._mask(input_ids, context_ids, attention_mask if padded else None,
                          key_pos, query_pos, seen)
        ves = self.value_embeds(input_ids) if self.value_embeds is not None else [None] * cfg.n_layer
        hidden, outputs = [x], []
        for i, block in enumerate(self.transformer.h):
            if self.skips is not None:
                x = self.skips(i, x, outputs)
            x = block(x, rope, mask, cache, ves[i])
            outputs.append(x)
            hidden.append(x)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)
        if cfg.logit_softcap:  # in fp32: in bf16 many logits near the cap would round alike
            logits = cfg.logit_softcap * torch.tanh(logits.float() / cfg.logit_softcap)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.size(-1)),
                                   labels[:, 1:].reshape(-1).to(logits.device), ignore_index=-100)
        out = CausalLMOutputWithPast(loss=loss, logits=logits,
                                     hidden_states=tuple(hidden[:-1]) + (x,) if output_hidden_states else None,
                                     **{CACHE: cache if use_cache else None})
        return out.to_tuple() if return_dict is False else out

    def _mask(self, input_ids, context_ids, padding, key_pos, query_pos, seen):
        """Which keys each new query may see: the causal ones, within the window, in its
        own document, not padding."""
        cfg = self.config
        T, S = input_ids.size(1), seen + input_ids.size(1)
        if not (cfg.attn_window or cfg.doc_mask) and padding is None:
            if seen == 0:
                return True
            if T == 1:  # the last position sees every cached one
                return False
        device = input_ids.device
        q = torch.arange(seen, S, device=device).unsqueeze(1)
        k = torch.arange(S, device=device).unsqueeze(0)
        mask = (q >= k).view(1, 1, T, S)
        if cfg.attn_window:
            near = query_pos.unsqueeze(-1) - key_pos.unsqueeze(-2) < cfg.attn_window
            mask = mask & (near.unsqueeze(1) if near.dim() == 3 else near.view(1, 1, T, S))
        if cfg.doc_mask:
            ids = input_ids if seen == 0 else context_ids
            if ids is None or ids.shape[-1] != S:
                raise ValueError(f"a model with doc_mask needs context_ids, all {S} tokens so "
                                 f"far, to continue a cache (generate() passes them)")
            # A token's document: the end-of-text tokens up to and including it
            docs = torch.cumsum(ids == cfg.eot_token_id, dim=1)
            mask = mask & (docs[:, seen:].unsqueeze(2) == docs.unsqueeze(1)).unsqueeze(1)
        if padding is not None:
            # padding keys are never seen; a padding query sees itself (no row all -inf)
            mask = (mask & padding.bool()[:, None, None, :]) | (q == k).view(1, 1, T, S)
        return mask
