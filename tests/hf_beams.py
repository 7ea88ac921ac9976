"""Beam search, batch changes and crop on an e8kv transformers cache (CPU E8KVCache or E8KVCudaCache),
checked against each row's history replayed alone: shared by py_hf_model.py (the CPU cache) and
py_hf_cuda.py."""
import torch

PROMPT = 17  # ≥ 16 tokens: the centring means come from them; a partial page of 16
# the plan: decode steps, then a change; the lengths at the changes are 19 (a partial page, below sink=20:
# the rows' sink rows must become their own), 27 (past sink=20, shared rows), 35 (two full pages shared),
# then a crop of 6 tokens right after that reorder (to 29, past the prompt: the second page, full and
# shared by the rows, is again the one they append into), 37, 40
PLAN = ((2, ("reorder", [2, 0, 2, 1])), (8, ("reorder", [1, 1, 3, 0])), (8, ("reorder", [0, 0, 1, 2])),
        (0, ("crop", 6)), (8, ("select", [3, 1])), (3, ("repeat", 2)), (3, None))


def _detach(model, cache):
    """A CUDA cache gives the model its attention implementation back (the CPU cache has nothing to undo)."""
    if hasattr(cache, "detach"):
        cache.detach(model.config)


def _step(model, cache, ids):
    with torch.no_grad():
        return model(input_ids=ids, past_key_values=cache, use_cache=True).logits[:, -1].float().clone()


def run_plan(model, cache, on, seed=5, step=None):
    """Runs PLAN on a batch of 4 random prompts (step: the forward of the one-token steps, e.g. compiled).
    Returns [(histories, logits)] at the end of each phase (before its batch change): histories a list of
    token lists, logits (rows, vocab)."""
    step = step or model
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (4, PROMPT), generator=g)
    hist = [row.tolist() for row in prompt]
    _step(model, cache, prompt.to(on))
    out = []
    for n, change in PLAN:
        for _ in range(n):
            tok = torch.randint(0, vocab, (len(hist), 1), generator=g)
            logits = _step(step, cache, tok.to(on))
            hist = [h + [int(t)] for h, t in zip(hist, tok[:, 0])]
        if n:
            out.append(([list(h) for h in hist], logits))
        if change is None:
            continue
        kind, arg = change
        if kind == "crop":
            cache.crop(-arg)
            hist = [h[:-arg] for h in hist]
        elif kind == "reorder":
            cache.reorder_cache(torch.tensor(arg, device=on))
            hist = [hist[i] for i in arg]
        elif kind == "select":
            cache.batch_select_indices(torch.tensor(arg, device=on))
            hist = [hist[i] for i in arg]
        else:
            cache.batch_repeat_interleave(arg)
            hist = [h for h in hist for _ in range(arg)]
    return out


def replay(model, make_cache, hist, on):
    """The logits after a history fed to a cache of its own as run_plan fed it (the prompt at once, then
    token by token)."""
    cache = make_cache(1)
    ids = torch.tensor([hist], device=on)
    _step(model, cache, ids[:, :PROMPT])
    for i in range(PROMPT, len(hist)):
        logits = _step(model, cache, ids[:, i:i + 1])
    _detach(model, cache)
    return logits[0]


def check_plan(model, make_cache, on, label, tol=5e-3):
    """Every row's logits at the end of every phase = its history replayed alone (within tol of the largest
    logit); the control: after the first reorder, a row that took another row's past differs from its own
    history replayed by far more."""
    cache = make_cache(4)
    phases = run_plan(model, cache, on)
    _detach(model, cache)
    worst, scale = 0.0, 0.0
    for hists, logits in phases:
        for i, h in enumerate(hists):
            ref = replay(model, make_cache, h, on)
            worst = max(worst, float((logits[i] - ref).abs().max()))
            scale = max(scale, float(ref.abs().max()))
    # control: phase 2's row 0 continues old row 2 (reorder [2, 0, 2, 1]); a cache that ignored the
    # reorder would have given it row 0's own past
    hists1, _ = phases[0]
    hists2, logits2 = phases[1]
    wrong = hists1[0] + hists2[0][len(hists1[0]):]
    ctl = float((logits2[0] - replay(model, make_cache, wrong, on)).abs().max())
    print(f"batch changes {label}: max |logit diff| vs each history alone {worst:.3g}, a missed reorder "
          f"(control) {ctl:.3g} (max |logit| {scale:.3g})")
    assert worst <= tol * scale, (worst, scale)
    assert ctl > 10 * max(worst, 1e-4 * scale), (ctl, worst)


def check_beam_generate(model, make_cache, on, label, beams=3, new=10, tol=2e-3):
    """generate(num_beams) with the cache: each returned beam's score (length_penalty 0: the sum of its
    tokens' log-probabilities) equals that of its tokens replayed alone; the cache's beams against those of
    the model's own cache (DynamicCache) are printed."""
    g = torch.Generator().manual_seed(9)
    prompt = torch.randint(0, model.config.vocab_size, (2, PROMPT), generator=g).to(on)
    kw = dict(max_new_tokens=new, num_beams=beams, num_return_sequences=beams, do_sample=False,
              length_penalty=0.0, early_stopping=False, output_scores=True, return_dict_in_generate=True,
              pad_token_id=0, eos_token_id=None)
    cache = make_cache(2 * beams)
    with torch.no_grad():
        out = model.generate(prompt, past_key_values=cache, **kw)
    _detach(model, cache)
    with torch.no_grad():
        ref = model.generate(prompt, **kw)
    same = sum(a.tolist() == b.tolist() for a, b in zip(out.sequences, ref.sequences))
    worst = 0.0
    for seq, score in zip(out.sequences, out.sequences_scores):
        seq = seq.tolist()
        c = make_cache(1)
        ids = torch.tensor([seq], device=on)
        with torch.no_grad():
            logits = model(input_ids=ids[:, :PROMPT], past_key_values=c, use_cache=True).logits[:, -1:].float()
            total = 0.0
            for i in range(PROMPT, len(seq)):
                total += float(torch.log_softmax(logits[0, -1], -1)[seq[i]])
                logits = model(input_ids=ids[:, i:i + 1], past_key_values=c, use_cache=True).logits.float()
        _detach(model, c)
        worst = max(worst, abs(total - float(score)))
    print(f"beam search {label}: {len(out.sequences)} beams, max |score - replayed score| {worst:.3g}; "
          f"{same}/{len(out.sequences)} beams equal the model's own cache's")
    assert out.sequences.shape == (2 * beams, PROMPT + new)
    assert worst <= tol * new, worst
