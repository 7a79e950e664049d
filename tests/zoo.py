"""The zoo of reference/peers.md: each case a model, its inputs and its closed-form MACs per role.

Hugging Face models are built from config objects with random weights (never downloaded).
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from closed_forms import add, attention, conv_out, ffn, rnn, rotary, times

D, H, N = 512, 8, 128  # width, heads and tokens of the small cases


# what a case exercises: the kernel of each torch.backends.mha fast path, and how its attention core runs
FASTPATH_KERNELS = {"native_mha": "aten._native_multi_head_attention",
                    "encoder_layer": "aten._transformer_encoder_layer_fwd"}
SDPA_CPU = "aten._scaled_dot_product_flash_attention_for_cpu"
ATTENTION_KINDS = (None, "matmul", "sdpa", "fused")  # None: no attention; fused: inside a fast-path kernel


def _cpu_sdpa_fuses_grouped_query() -> bool:
    """Whether this torch's CPU SDPA runs grouped-query attention (``enable_gqa``: fewer K/V heads, as Hugging
    Face's Llama passes it) in its fused kernel; torch 2.8 and before take the math path there (bmm's, as eager
    attention, whose backward computes the scores' gradients 2x, not the fused 3x)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: set[str] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.seen.add(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    q, kv = torch.zeros(1, 4, 8, 16), torch.zeros(1, 2, 8, 16)
    with Ops() as ops:
        F.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
    return SDPA_CPU in ops.seen


CPU_FUSED_GQA = _cpu_sdpa_fuses_grouped_query()


def transformers_distributes() -> bool:
    """Whether this transformers shards a built model with its own code from a ``DistributedConfig`` of tensor and
    expert parallel sizes (``initialize_distributed_mesh``, ``maybe_distribute_model``: transformers 5.2x; older ones
    shard only while loading weights)."""
    try:
        from transformers.distributed.configuration_utils import DistributedConfig
        from transformers.distributed.utils import initialize_distributed_mesh  # noqa: F401
    except ImportError:
        return False
    return "ep_size" in DistributedConfig.__dataclass_fields__


def hf_plan_shards_the_embedding() -> bool:
    """Whether this transformers' tensor-parallel plan for Llama shards the token embedding by vocabulary (newer
    transformers; older ones leave it whole, and the LM head's shard then has no token table of its shape: flopscope
    counts it as "other", not "logits")."""
    import transformers

    from flopscope.workloads.distributed import hf_plan

    tiny = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, vocab_size=32))
    return "model.embed_tokens" in hf_plan(tiny)


@dataclass
class Case:
    build: Callable[[], tuple[nn.Module, tuple[Any, ...], dict[str, Any]]]
    roles: dict[str, int]  # closed form per role (MACs)
    fastpath: bool | None = None  # None: leave torch.backends.mha alone; False: switch the fast path off
    must_run: set[str] = field(default_factory=set)  # ops the case exists to exercise
    family: str = ""  # architecture: mha, encoder_layer, hand_attention, bert, gpt2, llama, vit, conv, lstm
    source: str = "torch"  # torch (nn modules), hand (written in this file) or huggingface (transformers)
    attention: str | None = None  # how the attention core runs: one of ATTENTION_KINDS
    fastpath_kind: str | None = None  # the torch.backends.mha fast path the model is eligible for (FASTPATH_KERNELS)
    grouped_query: bool = False  # fewer K/V heads than query heads (SDPA's enable_gqa)

    def __post_init__(self) -> None:
        assert self.attention in ATTENTION_KINDS, self.attention
        assert self.fastpath_kind is None or self.fastpath_kind in FASTPATH_KERNELS, self.fastpath_kind

    @property
    def total(self) -> int:
        return sum(self.roles.values())


def seeded_randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def token_ids(batch: int, n: int, vocab: int, device: str | None = None) -> torch.Tensor:
    if device == "meta":
        return torch.zeros((batch, n), dtype=torch.long, device="meta")
    return torch.randint(0, vocab, (batch, n), generator=torch.Generator().manual_seed(n))


def hf(cls: str, cfg: str, attn: str | None = None, device: str | None = None, **config: Any) -> nn.Module:
    import transformers

    conf = getattr(transformers, cfg)(**config)
    if attn:
        conf._attn_implementation = attn
    torch.manual_seed(0)
    with torch.device(device or "cpu"):
        model = getattr(transformers, cls)(conf)
    return model.eval()


class SelfAttnMHA(nn.Module):
    """nn.MultiheadAttention called as self-attention mha(x, x, x)."""

    def __init__(self, d: int, h: int, batch_first: bool = False, need_weights: bool = True):
        super().__init__()
        self.mha = nn.MultiheadAttention(d, h, batch_first=batch_first)
        self.need_weights = need_weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mha(x, x, x, need_weights=self.need_weights)[0]


class HandAttention(nn.Module):
    """q/k/v/o nn.Linear and explicit attention, written with matmul, @ or SDPA."""

    def __init__(self, d: int = D, h: int = H, kind: str = "matmul"):
        super().__init__()
        self.h, self.dk, self.kind = h, d // h, kind
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, n, d = x.shape
        q, k, v = (p(x).view(B, n, self.h, self.dk).transpose(1, 2) for p in (self.q, self.k, self.v))
        if self.kind == "matmul":
            y = torch.matmul(F.softmax(torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.dk), dim=-1), v)
        elif self.kind == "at":
            y = F.softmax(q @ k.transpose(-2, -1) / math.sqrt(self.dk), dim=-1) @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v)
        return self.o(y.transpose(1, 2).reshape(B, n, d))


def module_case(make: Callable[[], nn.Module], *args: Any) -> Callable[[], tuple[nn.Module, tuple[Any, ...], dict]]:
    def build() -> tuple[nn.Module, tuple[Any, ...], dict]:
        torch.manual_seed(0)
        return make().eval(), args, {}
    return build


def hf_case(cls: str, cfg: str, inputs: Callable[[], Any], attn: str | None = None, **config: Any):
    def build() -> tuple[nn.Module, tuple[Any, ...], dict]:
        return hf(cls, cfg, attn, **config), (inputs(),), {}
    return build


MHA = attention(1, N, N, D, H)
BERT = add(times(12, add(attention(1, N, N, 768, 12), ffn(1, N, 768, 3072))), {"other": 768 * 768})  # + pooler
GPT2 = times(12, add(attention(1, N, N, 768, 12), ffn(1, N, 768, 4 * 768)))
LLAMA4 = add(times(4, add(attention(1, N, N, 512, 8, n_kv=2), ffn(1, N, 512, 1376, gated=True))), rotary(N, 512 // 8))
VIT_TOKENS = (224 // 16) ** 2 + 1
VIT = add({"conv": 768 * (224 // 16) ** 2 * 3 * 16 * 16},  # patch embedding, stride 16
          times(12, add(attention(1, VIT_TOKENS, VIT_TOKENS, 768, 12), ffn(1, VIT_TOKENS, 768, 3072))),
          {"other": 768 * 768})
BERT_CFG = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
LLAMA4_CFG = dict(hidden_size=512, intermediate_size=1376, num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=2, vocab_size=32000, max_position_embeddings=2048, use_cache=False)
ENCODER = add(MHA, ffn(1, N, D, 2048))


def _mha(**kwargs: Any) -> Callable[[], nn.Module]:
    return lambda: SelfAttnMHA(D, H, **kwargs)


def _encoder_layer() -> nn.Module:
    return nn.TransformerEncoderLayer(D, H, 2048, batch_first=True)


def _conv_stack() -> nn.Module:
    return nn.Sequential(*[nn.Conv1d(512, 512, 5, padding=2) for _ in range(4)])


TORCH_MHA = dict(family="mha", source="torch")
HAND = dict(family="hand_attention", source="hand")
HF = dict(source="huggingface")

CASES: dict[str, Case] = {
    "1a_mha_seqfirst_weights": Case(module_case(_mha(), seeded_randn(N, 1, D)), MHA,
                                    attention="matmul", **TORCH_MHA),
    "1b_mha_sdpa": Case(module_case(_mha(need_weights=False), seeded_randn(N, 1, D)), MHA,
                        must_run={SDPA_CPU}, attention="sdpa", **TORCH_MHA),
    "1c_mha_fastpath": Case(module_case(_mha(batch_first=True, need_weights=False), seeded_randn(1, N, D)), MHA,
                            must_run={FASTPATH_KERNELS["native_mha"]}, attention="fused", fastpath_kind="native_mha",
                            **TORCH_MHA),
    "1d_mha_nofastpath": Case(module_case(_mha(batch_first=True), seeded_randn(1, N, D)), MHA, fastpath=False,
                              attention="matmul", fastpath_kind="native_mha", **TORCH_MHA),
    "2a_encoder_layer_fastpath": Case(module_case(_encoder_layer, seeded_randn(1, N, D)), ENCODER,
                                      must_run={FASTPATH_KERNELS["encoder_layer"]}, family="encoder_layer",
                                      attention="fused", fastpath_kind="encoder_layer"),
    "2b_encoder_layer_nofastpath": Case(module_case(_encoder_layer, seeded_randn(1, N, D)), ENCODER, fastpath=False,
                                        family="encoder_layer", attention="sdpa", fastpath_kind="encoder_layer"),
    "3a_hand_matmul": Case(module_case(lambda: HandAttention(kind="matmul"), seeded_randn(1, N, D)), MHA,
                           attention="matmul", **HAND),
    "3b_hand_at": Case(module_case(lambda: HandAttention(kind="at"), seeded_randn(1, N, D)), MHA,
                       attention="matmul", **HAND),
    "3c_hand_sdpa": Case(module_case(lambda: HandAttention(kind="sdpa"), seeded_randn(1, N, D)), MHA,
                         must_run={SDPA_CPU}, attention="sdpa", **HAND),
    "4a_bert_base_sdpa": Case(hf_case("BertModel", "BertConfig", lambda: token_ids(1, N, 30522), **BERT_CFG), BERT,
                              must_run={SDPA_CPU}, family="bert", attention="sdpa", **HF),
    "4b_bert_base_eager": Case(hf_case("BertModel", "BertConfig", lambda: token_ids(1, N, 30522), "eager",
                                       **BERT_CFG), BERT, family="bert", attention="matmul", **HF),
    "5_gpt2": Case(hf_case("GPT2Model", "GPT2Config", lambda: token_ids(1, N, 50257), n_embd=768, n_layer=12,
                           n_head=12, use_cache=False), GPT2,
                   must_run={SDPA_CPU}, family="gpt2", attention="sdpa", **HF),
    "6a_llama4_sdpa": Case(hf_case("LlamaModel", "LlamaConfig", lambda: token_ids(1, N, 32000), **LLAMA4_CFG),
                           LLAMA4, must_run={SDPA_CPU}, family="llama", attention="sdpa", grouped_query=True, **HF),
    "6b_llama4_eager": Case(hf_case("LlamaModel", "LlamaConfig", lambda: token_ids(1, N, 32000), "eager",
                                    **LLAMA4_CFG), LLAMA4, family="llama", attention="matmul", **HF),
    "7_vit_base": Case(hf_case("ViTModel", "ViTConfig", lambda: seeded_randn(1, 3, 224, 224), image_size=224,
                               patch_size=16, **BERT_CFG), VIT,
                       must_run={SDPA_CPU}, family="vit", attention="sdpa", **HF),
    "8_conv1d_x4": Case(module_case(_conv_stack, seeded_randn(1, 512, N)),
                        {"conv": 4 * 1 * 512 * conv_out(N, k=5, pad=2) * 512 * 5}, family="conv"),
    "9_lstm": Case(module_case(lambda: nn.LSTM(512, 512), seeded_randn(N, 1, 512)),
                   {"recurrent": rnn(B=1, n=N, gates=4, d_in=512, d_h=512)},
                   must_run={"aten.mkldnn_rnn_layer"}, family="lstm"),
}


@functools.lru_cache(maxsize=2)
def built(name: str) -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
    """CASES[name] built once (the last two are kept: test modules sweep the cases in the same order)."""
    return CASES[name].build()


@contextlib.contextmanager
def fastpath(enabled: bool | None) -> Iterator[None]:
    """torch.backends.mha's fast path set to `enabled` inside the block (None: left alone)."""
    if enabled is None:
        yield
        return
    previous = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(enabled)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(previous)


LLAMA_7B = dict(d=4096, d_ff=11008, L=32, h=32, vocab=32000, n=2048)


def llama_7b_on_meta() -> tuple[nn.Module, torch.Tensor]:
    c = LLAMA_7B
    model = hf("LlamaModel", "LlamaConfig", device="meta", hidden_size=c["d"], intermediate_size=c["d_ff"],
               num_hidden_layers=c["L"], num_attention_heads=c["h"], num_key_value_heads=c["h"],
               vocab_size=c["vocab"], max_position_embeddings=4096)
    return model, token_ids(1, c["n"], c["vocab"], device="meta")
