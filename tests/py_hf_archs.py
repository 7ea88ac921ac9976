#!/usr/bin/env python3
"""pytest: the architectures of transformers through the e8kv caches, each as a tiny random model built from
its own config class (2 layers, 4 query / 2 KV heads, head_dim 32; the model types the installed transformers
lacks are skipped):
  - served: a 16-token prompt and 8 single-token steps give DynamicCache's logits with an exact format
    (`f32`; `f32,rope=pre` for the model types whose RoPE pair layout e8kv knows: keys handed over before
    RoPE and turned again by the C cache), and an E8 format (`e8box:4`) decodes to finite logits; the CUDA
    cache's Python (E8KVCudaCache) over tests/py_hf_cuda.py's CPU twin of its pages with `bf16` pages; on a
    GPU the CUDA cache itself (`f16` pages, and its default E8 format);
  - refused by name (UnsupportedModelError), never attended wrongly: encoders (non-causal attention),
    differential attention (DiffLlama splits V after the cache's update), mixture-of-attention heads (JetMoE
    repeats the KV heads in its own order), multi-head latent attention (DeepSeek-V3: K and V of other
    widths), soft-capping (Gemma 2), attention computed outside transformers' interface (Falcon, BLOOM, MPT),
    linear-attention layers (Qwen3-Next), cross-attention layers (Llama 3.2 Vision)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_skip  # noqa: E402  (E8KV_LIB and the package's path, as the other py_hf_ tests)
if __name__ == "__main__":
    sys.exit(hf_skip.run_as_script(__file__, model=False))

import warnings  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

import e8kv  # noqa: E402
import e8kv.hf  # noqa: E402
import py_hf_cuda  # noqa: E402  (PagesTwin: the CUDA cache's pages on the CPU)

# decoder-only model types e8kv serves (dense, MoE, partial RoPE, hybrids with sliding layers, learned sinks)
SERVED = ["llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi", "phi3", "gemma",
          "gemma3_text", "olmo", "olmo2", "olmoe", "granite", "granitemoe", "cohere", "stablelm", "starcoder2",
          "gpt_neox", "gptj", "codegen", "helium", "internlm3", "nemotron", "persimmon", "apertus", "arcee",
          "seed_oss", "hunyuan_v1_dense", "ernie4_5", "ernie4_5_moe", "glm4", "glm4_moe", "smollm3", "exaone4",
          "gpt_oss",
          # vision-language models, text-only (AutoModelForImageTextToText)
          "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "llava", "smolvlm", "idefics3", "mistral3", "gemma3"]

OWN_ATTENTION = "does not go through transformers' attention interface"  # (Falcon, BLOOM, MPT: their own code)
# model type -> the words of its refusal
REFUSED = {"bert": "attends non-causally",
           "diffllama": "other K/V than the cache's update returned",
           "jetmoe": "other K/V than the cache's update returned",
           "deepseek_v3": "gives K of",
           "gemma2": "soft-capping",
           "falcon": OWN_ATTENTION,
           "bloom": OWN_ATTENTION,
           "mpt": OWN_ATTENTION,
           "qwen3_next": "linear_attention",
           "mllama": "cross-attention layers"}

SMALL = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=32, vocab_size=512, max_position_embeddings=512)
SMALL_CUDA = dict(SMALL, hidden_size=256, head_dim=64)  # (the CUDA cache's head_dim: 64, 128 or 256)
VISION = dict(hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, depth=1, embed_dim=32,
              num_heads=2, image_size=28, patch_size=14)  # (a vision-language model's vision tower, never run)
PROMPT, STEPS = 16, 8
IMAGE_TOKENS = dict(image_token_id=300, vision_start_token_id=301, video_token_id=302, vision_end_token_id=303)


def tiny(model_type, device="cpu", hybrid=True, images=False):
    """A tiny random model of the type from its own config class, or a skip when transformers lacks it.
    hybrid: keep the type's own layer kinds (sliding / full), with at least one full-attention layer.
    images: a vision tower that runs (its merger's output the decoder's width) and image token ids inside
    the tiny vocabulary (IMAGE_TOKENS)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    try:
        cfg = AutoConfig.for_model(model_type)
    except (KeyError, ValueError) as e:
        pytest.skip(f"transformers {__import__('transformers').__version__} has no '{model_type}' ({str(e)[:60]})")
    text = cfg.get_text_config(decoder=True)  # (a composite config's decoder: Llama 3.2 Vision's)
    for c in {id(cfg): cfg, id(text): text}.values():
        for k, v in (SMALL_CUDA if device == "cuda" else SMALL).items():  # (DeepSeek's head_dim: its RoPE part's)
            if hasattr(c, k) and not (k == "head_dim" and model_type.startswith("deepseek")):
                try:
                    setattr(c, k, v)
                except AttributeError:  # (a derived property: Falcon's head_dim)
                    pass
        for k, v in [("num_local_experts", 4), ("num_experts", 4), ("n_routed_experts", 4), ("num_experts_per_tok", 2),
                     ("top_k", 2), ("moe_intermediate_size", 64), ("shared_expert_intermediate_size", 64),
                     ("rotary_dim", 16), ("pad_token_id", 1), ("bos_token_id", 1), ("eos_token_id", 2)]:
            if getattr(c, k, None) is not None:
                setattr(c, k, v)
    if getattr(text, "cross_attention_layers", None):
        text.cross_attention_layers = [1]
    types = list(getattr(text, "layer_types", None) or [])
    if types:  # two layers: the type's first kinds, the second a full-attention one
        text.layer_types = [types[0], "full_attention"] if hybrid else ["full_attention"] * 2
    if model_type == "bert":
        cfg.is_decoder = False  # (BertLMHeadModel as an encoder: bidirectional attention)
    if getattr(text, "sliding_window", None) and not types and model_type in ("mistral", "mixtral"):
        text.sliding_window = None  # (their default config is sliding on every layer: Mistral 7B v0.1)
    if "mrope_section" in (getattr(text, "rope_parameters", None) or {}) or model_type in ("qwen2_vl", "qwen2_5_vl"):
        # (Qwen2-VL's sections default to 16, 24, 24: head_dim 128's)
        hd = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        text.rope_parameters = dict(text.rope_parameters, mrope_section=[hd // 8, 3 * hd // 16, 3 * hd // 16])
    vision = getattr(cfg, "vision_config", None)
    for k, v in VISION.items():
        if vision is not None and hasattr(vision, k):
            setattr(vision, k, v)
    if images:
        if model_type == "qwen2_vl":  # (its vision hidden_size is the merger's output)
            vision.hidden_size = text.hidden_size
        if hasattr(vision, "out_hidden_size"):
            vision.out_hidden_size = text.hidden_size
        for c in (cfg, text):
            for k, v in IMAGE_TOKENS.items():
                if getattr(c, k, None) is not None:
                    setattr(c, k, v)
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    from transformers import AutoModelForImageTextToText
    auto = AutoModelForCausalLM if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES else AutoModelForImageTextToText
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.device(device):
            model = auto.from_config(cfg)
    return model.float().eval()


@torch.no_grad()
def run(model, cache, ids):
    """Logits of a prompt and single-token steps through the cache, concatenated over the positions."""
    out = [model(input_ids=ids[:, :PROMPT], past_key_values=cache, use_cache=True).logits]
    for i in range(PROMPT, ids.shape[1]):
        out.append(model(input_ids=ids[:, i:i + 1], past_key_values=cache, use_cache=True).logits)
    return torch.cat(out, 1)


def served(model_type, model):
    """Skip a model type whose modeling code in the installed transformers computes its own attention (GPT-J
    and CodeGen before transformers 5.2x): e8kv refuses it by name, which test_refused_architectures checks."""
    try:
        e8kv.hf.ModelShape(model.config)
    except e8kv.hf.UnsupportedModelError as e:
        if OWN_ATTENTION not in str(e):
            raise
        pytest.skip(f"{model_type} in transformers {__import__('transformers').__version__}: {e}")


def compare(model, make, ids, spec="f32"):
    """Relative max error of the logits through the cache that make() gives against DynamicCache's."""
    from transformers import DynamicCache
    ref = run(model, DynamicCache(config=model.config), ids)
    with e8kv.hf.compress(model, spec=spec):  # (attn_implementation "e8kv"; the cache is make()'s)
        got = run(model, make(), ids)
    assert got.shape == ref.shape
    assert torch.isfinite(got).all()
    return float((got - ref).abs().max() / ref.abs().max())


def ids_for(model, device="cpu"):
    g = torch.Generator().manual_seed(1)
    return torch.randint(3, min(500, model.config.get_text_config().vocab_size), (1, PROMPT + STEPS),
                         generator=g).to(device)


@pytest.fixture
def twin(monkeypatch):
    """E8KVCudaCache(device=torch.device("cpu", 0)) over PagesTwin: the CUDA cache's Python on the CPU."""
    for obj, name, value in py_hf_cuda.twin_patches():
        monkeypatch.setattr(obj, name, value)
    return lambda config, spec: e8kv.hf.E8KVCudaCache(config, spec, device=torch.device("cpu", 0), max_cache_len=64)


@pytest.mark.parametrize("model_type", SERVED)
def test_served_architectures(model_type, twin):
    model = tiny(model_type)
    served(model_type, model)
    ids = ids_for(model)
    specs = ["f32"] + (["f32,rope=pre"] if model_type in e8kv.hf.ROPE_LAYOUTS else [])
    for spec in specs:
        err = compare(model, lambda: e8kv.hf.E8KVCache(model.config, spec), ids)
        assert err < 1e-4, (model_type, spec, err)
    compare(model, lambda: e8kv.hf.E8KVCache(model.config, "e8box:4"), ids)  # finite, same shape
    err = compare(model, lambda: twin(model.config, "bf16"), ids, "bf16")
    assert err < 2e-2, (model_type, "twin bf16", err)  # (bf16's rounding of K/V)


@pytest.mark.parametrize("model_type", sorted(REFUSED))
def test_refused_architectures(model_type, twin):
    model = tiny(model_type)
    for spec, make in (("f32", lambda: e8kv.hf.E8KVCache(model.config, "f32")),
                       ("bf16", lambda: twin(model.config, "bf16"))):
        with pytest.raises(e8kv.hf.UnsupportedModelError, match=REFUSED[model_type]):
            with e8kv.hf.compress(model, spec=spec):
                run(model, make(), ids_for(model))


def test_known_rope_layouts_are_served():
    """Every model type with a RoPE pair layout is in the served list (its keys before RoPE are checked)."""
    assert set(e8kv.hf.ROPE_LAYOUTS) - {"ministral", "olmo3"} <= set(SERVED)


GPU = e8kv.cuda_available() and torch.cuda.is_available()


@pytest.mark.skipif(not GPU, reason="needs a GPU and a libe8kv built with nvcc")
@pytest.mark.parametrize("model_type", SERVED)
def test_served_architectures_cuda(model_type):
    """The CUDA cache (f16 pages) against DynamicCache on the same GPU, and the default E8 format runs."""
    model = tiny(model_type, "cuda")
    served(model_type, model)
    ids = ids_for(model, "cuda")
    err = compare(model, lambda: e8kv.hf.E8KVCache(model.config, "f16", device="cuda", max_cache_len=64), ids, "f16")
    assert err < 2e-3, (model_type, err)
    compare(model, lambda: e8kv.hf.E8KVCache(model.config, device="cuda", max_cache_len=64), ids, "f16")


@pytest.mark.skipif(not GPU, reason="needs a GPU and a libe8kv built with nvcc")
@pytest.mark.parametrize("model_type", ["diffllama", "jetmoe", "bert"])
def test_refused_architectures_cuda(model_type):
    model = tiny(model_type, "cuda")
    with pytest.raises(e8kv.hf.UnsupportedModelError, match=REFUSED[model_type]):
        with e8kv.hf.compress(model, spec="f16"):
            run(model, e8kv.hf.E8KVCache(model.config, "f16", device="cuda", max_cache_len=64), ids_for(model, "cuda"))


def tiny_gemma3_vlm(device="cpu"):
    """A tiny Gemma3ForConditionalGeneration (what AutoModelForCausalLM loads for gemma-3-4b and larger): its
    decoder holds the text config, and with token_type_ids its masks are composed by mask functions of its own
    (an image's tokens see each other; the sliding window as an and-mask). Layers full, sliding (window 8),
    full: the first full layer's outputs reach the logits through the second."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration
    hd = 64 if device == "cuda" else 32
    text = dict(vocab_size=300, hidden_size=4 * hd, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, head_dim=hd, sliding_window=8, max_position_embeddings=256,
                layer_types=["full_attention", "sliding_attention", "full_attention"])
    vision = dict(hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    cfg = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4, image_token_index=299,
                       boi_token_index=297, eoi_token_index=298)
    torch.manual_seed(0)
    with torch.device(device):
        return Gemma3ForConditionalGeneration(cfg).float().eval()


def check_gemma3_vlm(device, make, spec, tol, image_ok):
    """Text-only (with and without token_type_ids) and with an image block's token types: the logits of a
    20-token prompt (all positions) and 8 steps against DynamicCache's; an image block where the cache
    cannot take a non-causal mask (image_ok False) is refused by name."""
    from transformers import DynamicCache
    model = tiny_gemma3_vlm(device)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 290, (1, 28), generator=g).to(device)

    @torch.no_grad()
    def run(cache, tt):
        kw = {} if tt is None else {"token_type_ids": tt}
        out = [model(input_ids=ids[:, :20], past_key_values=cache, use_cache=True, **kw).logits[0]]
        for i in range(20, 28):
            out.append(model(input_ids=ids[:, i:i + 1], past_key_values=cache, use_cache=True).logits[0])
        return torch.cat(out)

    image = torch.zeros_like(ids[:, :20])
    image[:, 5:9] = 1
    for tt in (None, torch.zeros_like(ids[:, :20]), image):
        ref = run(DynamicCache(config=model.config), tt)
        if tt is image and not image_ok:
            with pytest.raises(e8kv.hf.UnsupportedModelError, match="not causal"):
                with e8kv.hf.compress(model, spec=spec):
                    run(make(model), tt)
            continue
        with e8kv.hf.compress(model, spec=spec):
            got = run(make(model), tt)
        err = float((got - ref).abs().max() / ref.abs().max())
        assert err < tol, (spec, None if tt is None else int(tt.sum()), err)


def test_gemma3_multimodal_model(twin):
    """The CPU cache: text-only served, an image's bidirectional block refused (its attention is over codes);
    the CUDA cache's Python over the twin: all three served (the prompt's attention takes the model's mask)."""
    check_gemma3_vlm("cpu", lambda m: e8kv.hf.E8KVCache(m.config, "f32"), "f32", 1e-4, image_ok=False)
    check_gemma3_vlm("cpu", lambda m: twin(m.config, "bf16"), "bf16", 2e-2, image_ok=True)


@pytest.mark.parametrize("model_type", ["gemma3_text", "gpt_oss"])
def test_hybrid_cache_pickles_and_copies(model_type, twin):
    """A hybrid model's cache (sliding-window layers beside the coded ones; gpt-oss's learned sinks) through
    torch.save / torch.load (then attach) and copy.deepcopy: the next steps' logits are the source cache's,
    bit for bit, for the CPU cache and the CUDA cache's Python over its twin."""
    import copy
    import io
    model = tiny(model_type)
    ids = ids_for(model)
    for make in (lambda: e8kv.hf.E8KVCache(model.config, "e8:4,sink=1"), lambda: twin(model.config, "e8box:4,sink=4")):
        cache = make()
        with torch.no_grad():
            model(input_ids=ids[:, :PROMPT], past_key_values=cache, use_cache=True)
        buf = io.BytesIO()
        torch.save(cache, buf)
        buf.seek(0)
        loaded = torch.load(buf, weights_only=False)
        loaded.attach(model.config)
        copied = copy.deepcopy(cache)
        with torch.no_grad():
            got = [model(input_ids=ids[:, PROMPT:], past_key_values=c, use_cache=True).logits
                   for c in (loaded, copied, cache)]
        assert torch.equal(got[0], got[2]) and torch.equal(got[1], got[2])


def test_text_config_keeps_its_fallback(twin):
    """Both caches route a multimodal model's text config (its decoder layers' config) to e8kv with the
    implementation it had as the fallback of the layers they do not code (setting the composite config's
    implementation sets the text config's too, before its own could be read); detach gives it back."""
    for make in (lambda c: e8kv.hf.E8KVCache(c, "f32"), lambda c: twin(c, "bf16")):
        model = tiny_gemma3_vlm()
        model.config._attn_implementation = "eager"
        cache = make(model.config)
        for cfg in (model.config, model.config.get_text_config(decoder=True)):
            assert (cfg._attn_implementation, cfg._e8kv_fallback) == ("e8kv", "eager")
        if hasattr(cache, "detach"):
            cache.detach(model.config)
            assert model.config.get_text_config(decoder=True)._attn_implementation == "eager"


# vision-language models whose RoPE has sections over time, height and width (M-RoPE): an image's tokens
# take 2-D positions, and the text after it positions that are not its token indices
MROPE_TYPES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]


@torch.no_grad()
def run_image(model, cache, device="cpu"):
    """Logits of a 24-token prompt holding a 4-token image (a 4 x 4 patch grid, merged 2 x 2), then 8
    single-token steps, through the cache."""
    vc = model.config.vision_config
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(10, 200, (1, 32), generator=g)
    ids[0, 3], ids[0, 4:8], ids[0, 8] = IMAGE_TOKENS["vision_start_token_id"], IMAGE_TOKENS["image_token_id"], \
        IMAGE_TOKENS["vision_end_token_id"]
    pix = torch.randn(16, 3 * vc.temporal_patch_size * vc.patch_size ** 2, generator=g)
    ids, pix = ids.to(device), pix.to(device)
    kw = dict(pixel_values=pix, image_grid_thw=torch.tensor([[1, 4, 4]], device=device),
              mm_token_type_ids=(ids[:, :24] == IMAGE_TOKENS["image_token_id"]).long())
    out = [model(input_ids=ids[:, :24], past_key_values=cache, use_cache=True, **kw).logits]
    for i in range(24, 32):
        out.append(model(input_ids=ids[:, i:i + 1], past_key_values=cache, use_cache=True).logits)
    return torch.cat(out, 1)


def compare_image(model, make, device="cpu"):
    from transformers import DynamicCache
    ref = run_image(model, DynamicCache(config=model.config), device)
    got = run_image(model, make(), device)
    assert torch.isfinite(got).all()
    return float((got - ref).abs().max() / ref.abs().max())


@pytest.mark.parametrize("model_type", MROPE_TYPES)
def test_mrope_model_with_an_image(model_type, twin):
    """Qwen2-VL, Qwen2.5-VL, Qwen3-VL with an image in the prompt (its vision tower run, its tokens at M-RoPE's
    2-D positions, the text after it at positions past its token indices): the CPU cache's exact codes give
    DynamicCache's logits (keys are stored as the layers give them, after RoPE), the CUDA cache's Python over
    the twin's bf16 pages within bf16's error; rope=pre is refused by name (no known pair layout, and M-RoPE's
    positions are not the token indices the CPU cache would turn keys back by)."""
    model = tiny(model_type, images=True)
    assert compare_image(model, lambda: e8kv.hf.E8KVCache(model.config, "f32")) < 1e-4
    assert compare_image(model, lambda: twin(model.config, "bf16")) < 2e-2
    with pytest.raises(e8kv.hf.UnsupportedModelError, match="RoPE pair layout"):
        e8kv.hf.E8KVCache(model.config, "f32,rope=pre")


def test_llava_with_an_image(twin):
    """LLaVA with a 28 x 28 image (4 patch features after CLIP, projected into 4 image tokens of the prompt;
    plain 1-D positions): the CPU cache's exact codes give DynamicCache's logits, the twin's bf16 pages within
    bf16's error."""
    from transformers import DynamicCache
    model = tiny("llava", images=True)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(10, 200, (1, 32), generator=g)
    ids[0, 3:7] = IMAGE_TOKENS["image_token_id"]
    pix = torch.randn(1, 3, 28, 28, generator=g)

    @torch.no_grad()
    def go(cache):
        out = [model(input_ids=ids[:, :24], pixel_values=pix, past_key_values=cache, use_cache=True).logits]
        out += [model(input_ids=ids[:, i:i + 1], past_key_values=cache, use_cache=True).logits for i in range(24, 32)]
        return torch.cat(out, 1)

    ref = go(DynamicCache(config=model.config))
    for make, tol in ((lambda: e8kv.hf.E8KVCache(model.config, "f32"), 1e-4), (lambda: twin(model.config, "bf16"), 2e-2)):
        got = go(make())
        assert float((got - ref).abs().max() / ref.abs().max()) < tol


@pytest.mark.skipif(not GPU, reason="needs a GPU and a libe8kv built with nvcc")
@pytest.mark.parametrize("model_type", MROPE_TYPES)
def test_mrope_model_with_an_image_cuda(model_type):
    """The same through the CUDA cache: f16 pages within f16's error, its default format finite."""
    model = tiny(model_type, "cuda", images=True)
    mk = lambda spec: lambda: e8kv.hf.E8KVCache(model.config, spec, device="cuda", max_cache_len=64)  # noqa: E731
    assert compare_image(model, mk("f16"), "cuda") < 2e-3
    assert compare_image(model, mk(None), "cuda") < 1.0


@pytest.mark.skipif(not GPU, reason="needs a GPU and a libe8kv built with nvcc")
def test_gemma3_multimodal_model_cuda():
    check_gemma3_vlm("cuda", lambda m: e8kv.hf.E8KVCache(m.config, "f16", device="cuda", max_cache_len=64), "f16",
                     2e-3, image_ok=True)
