"""Workloads: parameter counts and tensor lists against published models, FLOPs by hand."""

import numpy as np
import pytest

from commsim.catalog import gpu
from commsim.specs import LayerSpec, ModelSpec, SpecError
from commsim.workload.model import layer_times
from commsim.workload.presets import MODEL_NAMES, build_workload


@pytest.mark.parametrize(
    "name, params",
    [
        ("gpt2-xl", 1_557_611_200),  # HF gpt2-xl num_parameters()
        ("llama2-7b", 6_738_415_616),  # HF Llama-2-7b-hf
        ("llama2-70b", 68_976_648_192),  # HF Llama-2-70b-hf
        ("resnet50", 25_557_032),  # torchvision ResNet50_Weights.IMAGENET1K_V1 num_params
    ],
)
def test_published_parameter_counts(name, params):
    assert build_workload(name).params == params


def test_gpt3_parameters():
    # 96 blocks of 12h^2 + 13h, token (50257) and position (2048) tables, final LayerNorm
    h = 12288
    expected = 96 * (12 * h * h + 13 * h) + 50257 * h + 2048 * h + 2 * h
    w = build_workload("gpt3-175b")
    assert w.params == expected == 174_604_259_328  # "175B" in Brown et al.; ~174.6B exact


def test_bert_large_parameters():
    w = build_workload("bert-large")
    layers = {layer.name: layer for layer in w.layers}
    assert layers["pooler"].params == 1024 * 1024 + 1024
    assert w.params - layers["lm_head"].params == 335_141_888  # HF BertModel (bert-large-uncased)
    assert layers["lm_head"].params == 1_084_220  # BertPreTrainingHeads, decoder weight tied


@pytest.mark.parametrize(
    "name, tensors",
    [
        ("gpt2-xl", 2 + 48 * 12 + 2),  # wte, wpe, 48 blocks, ln_f; lm_head tied to wte
        ("gpt3-175b", 2 + 96 * 12 + 2),
        ("llama2-7b", 1 + 32 * 9 + 1 + 1),  # 291, as in the HF checkpoint
        ("llama2-70b", 1 + 80 * 9 + 1 + 1),
        ("bert-large", 5 + 24 * 16 + 2 + 7),  # BertForPreTraining.parameters()
        ("resnet50", 53 + 53 * 2 + 2),  # 161: torchvision resnet50().parameters()
    ],
)
def test_tensor_counts(name, tensors):
    w = build_workload(name)
    assert len(w.tensor_params) == len(w.tensor_layer) == tensors
    assert (w.tensor_params > 0).all()
    per_layer = np.bincount(w.tensor_layer, weights=w.tensor_params, minlength=len(w.layers))
    np.testing.assert_array_equal(per_layer, w.layer_params)
    assert all(layer.params == sum(layer.tensors) for layer in w.layers)


def test_gpt2_xl_tensors_in_registration_order():
    h, v = 1600, 50257
    w = build_workload("gpt2-xl")
    layers = {layer.name: layer for layer in w.layers}
    assert layers["embedding"].tensors == (v * h, 1024 * h)  # wte, wpe
    # ln_1 (weight, bias), attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj (weight, bias)
    block = (h, h, h * 3 * h, 3 * h, h * h, h, h, h, h * 4 * h, 4 * h, 4 * h * h, h)
    assert layers["block.0"].tensors == layers["block.47"].tensors == block
    assert sum(block) == 12 * h * h + 13 * h
    assert layers["final_norm"].tensors == (h, h)
    assert layers["lm_head"].tensors == ()  # the tied wte belongs to the embedding only


def test_llama2_7b_tensors_in_registration_order():
    h, f, v = 4096, 11008, 32000
    w = build_workload("llama2-7b")
    # q, k, v, o; gate, up, down; input_layernorm, post_attention_layernorm
    assert w.layers[1].tensors == (h * h,) * 4 + (h * f,) * 3 + (h, h)
    assert [w.layers[i].tensors for i in (0, -2, -1)] == [(v * h,), (h,), (v * h,)]


def test_bert_large_tensors_in_registration_order():
    h, f, v = 1024, 4096, 30522
    layers = {layer.name: layer for layer in build_workload("bert-large").layers}
    # word, position, token-type embeddings, embedding LayerNorm
    assert layers["embedding"].tensors == (v * h, 512 * h, 2 * h, h, h)
    # query, key, value, attention output dense, its LayerNorm, intermediate, output, LayerNorm
    assert layers["block.0"].tensors == (
        *(h * h, h) * 4,
        *(h, h),
        *(h * f, f),
        *(f * h, h),
        *(h, h),
    )
    assert layers["pooler"].tensors == (h * h, h)
    # cls: predictions.bias, transform dense and LayerNorm, seq_relationship (NSP)
    assert layers["lm_head"].tensors == (v, h * h, h, h, h, h * 2, 2)


def test_gqa_block_of_llama2_70b():
    # q and o: h x h; k and v: h x (8 kv heads * 128); gate/up/down: 3 h x 28672; 2 RMSNorms
    h, kv = 8192, 8 * 128
    block = next(layer for layer in build_workload("llama2-70b").layers if layer.name == "block.0")
    assert block.params == 2 * h * h + 2 * h * kv + 3 * h * 28672 + 2 * h == 855_654_400
    assert block.tensors[:4] == (h * h, h * kv, h * kv, h * h)  # q, k, v, o


def test_gpt3_forward_flops_match_narayanan():
    # Narayanan et al. 2021 eq. (3) without recompute: training FLOPs per sequence
    # 72 s L h^2 (1 + s/(6h) + V/(12 L h)), i.e. 3x the forward.
    L, h, s, V = 96, 12288, 2048, 50257
    w = build_workload("gpt3-175b")
    assert w.train_flops == pytest.approx(72 * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h)))


def test_llama2_7b_flops_per_token_is_6n_plus_attention():
    L, h, s, V, f = 32, 4096, 4096, 32000, 11008
    w = build_workload("llama2-7b")
    matmul = L * (4 * h * h + 3 * h * f) + V * h  # blocks + untied head; embedding is a lookup
    assert w.train_flops / s == pytest.approx(6 * matmul + 12 * L * s * h)
    # the 6N rule over all parameters is within a few percent of the matmul part
    assert 6 * w.params == pytest.approx(6 * matmul, rel=0.03)


def test_tied_head_has_no_parameters_but_costs_logits():
    head = build_workload("gpt2-xl").layers[-1]
    assert (head.name, head.params) == ("lm_head", 0)
    assert head.forward_flops == 2 * 1024 * 1600 * 50257


def test_resnet50_layers():
    w = build_workload("resnet50")
    names = [layer.name for layer in w.layers]
    assert names[:3] == ["conv1", "bn1", "layer1.0.conv1"]
    assert names[-3:] == ["layer4.2.conv3", "layer4.2.bn3", "fc"]
    assert len(w.layers) == 53 * 2 + 1  # 53 convs each with a batch norm, and fc
    conv1, fc = w.layers[0], w.layers[-1]
    assert conv1.tensors == (64 * 3 * 7 * 7,) == (9408,)  # convs have no bias
    assert w.layers[1].tensors == (64, 64)  # batch norm weight and bias
    assert conv1.forward_flops == 2 * 9408 * 112 * 112  # 2 FLOPs per MAC
    assert fc.tensors == (2048 * 1000, 1000)
    assert w.forward_flops / 2 == pytest.approx(4.09e9, rel=0.005)  # torchvision: 4.09 GMAC
    assert w.seq_len is None


def test_seq_len_override_changes_flops_not_params():
    base, short = build_workload("llama2-7b"), build_workload("llama2-7b", seq_len=2048)
    assert short.params == base.params and short.seq_len == 2048
    assert short.forward_flops < base.forward_flops / 2  # attention is quadratic in s
    ref = build_workload(ModelSpec(name="llama2-7b", seq_len=2048))
    assert ref.forward_flops == short.forward_flops


def test_explicit_specs_match_presets():
    gpt = ModelSpec(name="g", layers=48, hidden=1600, heads=25, vocab=50257, seq_len=1024)
    assert build_workload(gpt).layers == build_workload("gpt2-xl").layers
    llama = ModelSpec(
        name="l", layers=32, hidden=4096, heads=32, ffn_hidden=11008, gated_mlp=True, vocab=32000
    )
    built = build_workload(llama, seq_len=4096)
    assert built.params == 6_738_415_616
    assert built.layers == build_workload("llama2-7b").layers


def test_custom_layers():
    spec = ModelSpec(
        name="mlp",
        kind="custom",
        custom_layers=[
            LayerSpec(name="a", params=10, forward_flops=20.0),
            LayerSpec(name="b", params=5, forward_flops=0),
            LayerSpec(name="c", params=0, forward_flops=4.0),
        ],
    )
    w = build_workload(spec)
    assert [layer.name for layer in w.layers] == ["a", "b", "c"]
    assert [layer.tensors for layer in w.layers] == [(10,), (5,), ()]  # one tensor per layer
    assert (w.params, w.forward_flops, w.train_flops) == (15, 24.0, 72.0)


@pytest.mark.parametrize(
    "model, seq_len, field",
    [
        ("gpt-5", None, "model"),
        (ModelSpec(name="x", layers=2, heads=4, vocab=100, seq_len=8), None, "model.hidden"),
        (ModelSpec(name="x", layers=2, hidden=64, heads=4, vocab=100), None, "model.seq_len"),
        (
            ModelSpec(name="x", layers=2, hidden=64, heads=5, vocab=9, seq_len=8),
            None,
            "model.heads",
        ),
        (
            ModelSpec(name="x", layers=2, hidden=64, heads=4, kv_heads=3, vocab=9, seq_len=8),
            None,
            "model.kv_heads",
        ),
        (
            ModelSpec(name="x", layers=2, hidden=64, heads=4, gated_mlp=True, vocab=9, seq_len=8),
            None,
            "model.ffn_hidden",
        ),
        (ModelSpec(name="x", kind="custom"), None, "model.custom_layers"),
        ("gpt2-xl", 2048, "seq_len"),  # beyond its 1024 learned positions
    ],
)
def test_bad_specs_name_the_field(model, seq_len, field):
    with pytest.raises(SpecError) as err:
        build_workload(model, seq_len, source="s.yaml")
    assert (err.value.source, err.value.field) == ("s.yaml", field)


def test_unknown_preset_lists_known_ones():
    with pytest.raises(SpecError, match="llama2-70b"):
        build_workload("llama3")
    assert set(MODEL_NAMES) >= {"gpt2-xl", "gpt3-175b", "llama2-7b", "bert-large", "resnet50"}


def test_layer_times():
    w, a100 = build_workload("gpt2-xl"), gpu("a100")
    forward, backward = layer_times(w, a100, efficiency=0.5, micro_batch=4)
    block = 2 * 1024 * (12 * 1600**2) + 4 * 1024**2 * 1600
    assert forward[1] == pytest.approx(4 * block / (312e12 * 0.5))
    np.testing.assert_allclose(backward, 2 * forward)
    assert forward[0] == 0.0  # the embedding lookup
    with pytest.raises(ValueError):
        layer_times(w, a100, efficiency=0.0, micro_batch=1)


def test_mixtral_parameters_match_the_published_totals():
    # per block: attention q, o 4096^2 and k, v 4096 x 1024 (8 kv heads); router 4096 x 8;
    # 8 SwiGLU experts of 3 x 4096 x 14336; two RMSNorms. Plus embedding, untied head, norm.
    h, f, kv, e, v = 4096, 14336, 1024, 8, 32000
    attn, expert = 2 * h * h + 2 * h * kv, 3 * h * f
    block = attn + h * e + e * expert + 2 * h
    w = build_workload("mixtral-8x7b")
    assert w.params == 32 * block + 2 * v * h + h == 46_702_792_704
    active = 32 * (attn + h * e + 2 * expert + 2 * h) + 2 * v * h + h
    assert w.active_params == active == 12_879_925_248
    # Jiang et al. 2024: "46.7B total, 12.9B active", given to 0.1B: within 0.05B of each
    assert abs(w.params - 46.7e9) < 0.05e9 and abs(w.active_params - 12.9e9) < 0.05e9
    assert (w.experts, w.top_k, w.capacity_factor, w.seq_len) == (8, 2, 1.25, 4096)
    assert w.expert_params == e * expert


def test_moe_block_tensors_and_flops_count_top_k_experts():
    w = build_workload("mixtral-8x7b")
    block = w.layers[1]
    h, f, kv, s = 4096, 14336, 1024, 4096
    # q, k, v, o, router, 8 x (gate, up, down), two norms
    assert block.tensors[:5] == (h * h, h * kv, h * kv, h * h, h * 8)
    assert block.tensors[5:8] == (h * f, h * f, f * h) and len(block.tensors) == 4 + 1 + 24 + 2
    matmul = 2 * h * h + 2 * h * kv + h * 8 + 2 * 3 * h * f  # top-2 experts only
    assert block.forward_flops == 2 * s * matmul + 4 * s * s * h


def test_explicit_moe_spec_matches_the_preset():
    spec = ModelSpec(
        name="m",
        layers=32,
        hidden=4096,
        heads=32,
        kv_heads=8,
        ffn_hidden=14336,
        gated_mlp=True,
        vocab=32000,
        seq_len=4096,
        experts=8,
    )
    built = build_workload(spec)
    assert built.layers == build_workload("mixtral-8x7b").layers
    with pytest.raises(SpecError, match="model.top_k"):
        build_workload(spec.model_copy(update={"top_k": 9}))


@pytest.mark.parametrize(
    "name,params,active",
    [
        # HF config.json parameter counts (safetensors metadata "total"), Meta / Qwen / DeepSeek
        ("llama3-8b", 8_030_261_248, 8_030_261_248),
        ("llama3-70b", 70_553_706_496, 70_553_706_496),
        ("llama3-405b", 405_853_388_800, 405_853_388_800),
        ("qwen2.5-72b", 72_706_203_648, 72_706_203_648),
        ("mixtral-8x22b", 140_620_634_112, None),
        ("deepseek-v3", 671_026_404_352, None),
    ],
)
def test_modern_presets_match_their_published_sizes(name, params, active):
    w = build_workload(name)
    assert w.params == params
    if active:
        assert w.active_params == active
    if name == "deepseek-v3":  # "671B total parameters, of which 37B are activated"
        assert 36.5e9 < w.active_params < 38e9


def test_latent_attention_block_by_hand():
    # DeepSeek-V3's MLA per block: q_a 7168 x 1536 + norm 1536 + q_b 1536 x 128 (128 + 64),
    # kv_a 7168 x (512 + 64) + norm 512 + kv_b 512 x 128 (128 + 128), o 128 x 128 x 7168
    h, heads = 7168, 128
    mla = h * 1536 + 1536 + 1536 * heads * 192 + h * 576 + 512 + 512 * heads * 256
    mla += heads * 128 * h
    w = build_workload("deepseek-v3")
    dense, moe = w.layers[1], w.layers[4]  # block.0 (dense), block.3 (the first MoE one)
    mlp = 3 * h * 18432
    assert dense.params == mla + mlp + 2 * h  # two RMSNorms
    experts = 256 * 3 * h * 2048
    assert moe.params == mla + h * 256 + 3 * h * 2048 + experts + 2 * h  # router, shared
    assert sum(n for n, s in zip(moe.tensors, moe.shards, strict=True) if s == "ep") == experts
    # forward FLOPs: 2 s x (matmul parameters a token runs: MLA without its norms, the router,
    # the shared expert and 8 routed ones) + the attention core 2 s^2 heads (192 + 128)
    s = 4096
    matmul = mla - 1536 - 512 + h * 256 + 9 * 3 * h * 2048
    assert moe.forward_flops == pytest.approx(2 * s * matmul + 2 * s * s * heads * 320)
    assert w.attention_flops == pytest.approx(2 * s * s * heads * 320)


def test_head_dim_sliding_window_and_tied_embeddings():
    base = dict(name="m", layers=4, hidden=512, heads=8, vocab=1000, seq_len=1024)
    plain = build_workload(ModelSpec(**base))
    wide = build_workload(ModelSpec(**base, head_dim=128))  # 8 x 128 = 1024-wide attention
    q_plain, q_wide = plain.layers[1].tensors[2], wide.layers[1].tensors[2]  # fused c_attn
    assert (q_plain, q_wide) == (512 * 3 * 512, 512 * 3 * 1024)
    assert wide.attention_flops == pytest.approx(2 * plain.attention_flops)
    # a 256-token window on every other block: half the blocks attend to 256 of 1024 keys
    windowed = build_workload(ModelSpec(**base, sliding_window=256, window_every=2))
    assert windowed.attention_flops == pytest.approx(plain.attention_flops * (1 + 0.25) / 2)
    untied = build_workload(ModelSpec(**base, tied_embeddings=False))
    assert untied.params - plain.params == 1000 * 512  # the head's own matrix


def test_dense_first_layers_and_shared_experts():
    spec = ModelSpec(
        name="m",
        layers=4,
        hidden=256,
        heads=4,
        vocab=1000,
        seq_len=128,
        gated_mlp=True,
        ffn_hidden=1024,
        experts=8,
        top_k=2,
        moe_ffn_hidden=128,
        shared_experts=2,
        dense_layers=1,
    )
    w = build_workload(spec)
    dense, moe = w.layers[1], w.layers[2]
    assert "ep" not in dense.shards and dense.params < moe.params
    assert w.expert_params == pytest.approx(8 * 3 * 256 * 128 * 3 / 4)  # 3 of 4 blocks
    # after the router (replicated), the shared experts' MLP (2 x 128 wide: gate, up, down)
    # is split over tp like a dense one; the routed experts follow, on their ep ranks
    router = moe.tensors.index(256 * 8)
    assert moe.shards[router] == ""
    assert moe.tensors[router + 1 : router + 4] == (256 * 256,) * 3
    assert moe.shards[router + 1 : router + 5] == ("tp", "tp", "tp", "ep")
