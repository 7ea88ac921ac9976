"""Shared by tests/py_hf_cuda.py and tests/py_hf_model.py: a batch of prompts of different lengths padded as
transformers' tokenizers pad them, and a teacher-forced run of it through a model and a cache."""
import torch


def padded_batch(prompts, side):
    """ids, attention mask and position ids (b, T) of 1-D prompts padded to the longest on `side`."""
    T = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), T), dtype=torch.long, device=prompts[0].device)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        at = slice(T - len(p), T) if side == "left" else slice(0, len(p))
        ids[i, at], mask[i, at] = p, 1
    return ids, mask, (mask.cumsum(1) - 1).clamp(min=0)


def run_padded(model, cache, prompts, blocks, side, masks=True, step=None):
    """The padded prompts (eager), then each block of tokens (b, n) in turn, teacher-forced, the mask grown by
    ones (masks=False: no mask after the prompt; step: the forward of the one-token blocks). Returns the
    float32 logits (b, 1 + Σn, vocab): each row's last real prompt token's, then every block token's."""
    step = step or model
    ids, mask, pos = padded_batch(prompts, side)
    b, on = len(prompts), ids.device
    nxt = torch.tensor([len(p) for p in prompts], device=on)
    with torch.no_grad():
        lg = model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True).logits
        last = torch.full_like(nxt, ids.shape[1] - 1) if side == "left" else nxt - 1
        out = [lg[torch.arange(b, device=on), last].float()[:, None].clone()]
        for blk in blocks:
            n = blk.shape[1]
            mask = torch.cat((mask, torch.ones((b, n), dtype=mask.dtype, device=on)), 1)
            f = step if n == 1 else model
            lg = f(input_ids=blk, attention_mask=mask if masks else None, past_key_values=cache, use_cache=True,
                   position_ids=nxt[:, None] + torch.arange(n, device=on)).logits
            out.append(lg.float().clone())
            nxt = nxt + n
    return torch.cat(out, 1)
