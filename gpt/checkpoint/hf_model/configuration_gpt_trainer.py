"""The configuration of a gpt2-trainer model beyond GPT-2, for transformers.

An export folder carries this file beside modeling_gpt_trainer.py; config.json's auto_map
names both, so AutoConfig and AutoModelForCausalLM load the folder with
trust_remote_code=True. It imports only transformers.
"""

from transformers import PretrainedConfig


class GPTTrainerConfig(PretrainedConfig):
    """GPT-2's shape (n_layer blocks of n_head heads, n_embd wide, an MLP 4x as wide, a
    context of block_size tokens) with the trainer's options, each off by default:

    rotary: rotary positions in attention instead of a learned position table
    rmsnorm: RMSNorm instead of LayerNorm; qk_norm: each head's queries and keys RMS-normed
    relu2: relu(x)^2 in the MLP instead of tanh-approximated GELU
    tie_word_embeddings: False where the model was trained with a head of its own
    logit_softcap: logits soft-capped at +-C (C * tanh(z / C)); 0: off
    value_embeds: token tables mixed into the values of the first and last few blocks
    unet_skips: each late block also gets its mirror early block's output
    attn_window: each query sees at most this many positions, itself included (the window
        the weights were last trained with); 0: every earlier position
    doc_mask: no attention across the end-of-text token (eot_token_id) between documents
    """

    model_type = "gpt_trainer"
    attribute_map = {"hidden_size": "n_embd", "num_attention_heads": "n_head",
                     "num_hidden_layers": "n_layer", "max_position_embeddings": "block_size"}

    def __init__(self, vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768,
                 dropout=0.0, rotary=False, rmsnorm=False, qk_norm=False, relu2=False,
                 logit_softcap=0.0, value_embeds=False, unet_skips=False, attn_window=0,
                 doc_mask=False, eot_token_id=50256, initializer_range=0.02, use_cache=True,
                 tie_word_embeddings=True, bos_token_id=50256, eos_token_id=50256, **kwargs):
        self.vocab_size = vocab_size
        self.block_size = block_size
        self.n_layer = n_layer
        self.n_head = n_head
        self.n_embd = n_embd
        self.dropout = dropout
        self.rotary = rotary
        self.rmsnorm = rmsnorm
        self.qk_norm = qk_norm
        self.relu2 = relu2
        self.logit_softcap = logit_softcap
        self.value_embeds = value_embeds
        self.unet_skips = unet_skips
        self.attn_window = attn_window
        self.doc_mask = doc_mask
        self.eot_token_id = eot_token_id
        self.initializer_range = initializer_range
        self.use_cache = use_cache
        super().__init__(tie_word_embeddings=tie_word_embeddings, bos_token_id=bos_token_id,
                         eos_token_id=eos_token_id, **kwargs)
