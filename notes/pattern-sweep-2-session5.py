import torch, ember, torch.nn as nn, torch.nn.functional as F
x = torch.randn(4, 8)
lin = nn.Linear(8, 8)
cases = {}
def case(f): cases[f.__name__] = f; return f
@torch.no_grad()
def helper(t): return t * 2
@case
def no_grad_decorator(x): return helper(x) + lin(x)
@case
def inference_mode_block(x):
    with torch.inference_mode():
        y = x * 3
    return y + 1
@case
def enable_grad_inside(x):
    with torch.no_grad():
        with torch.enable_grad():
            y = lin(x)
    return y
@case
def new_zeros_like(x): return x.new_zeros(x.shape) + x.new_ones((1, 8)) * 2 + x.new_full((4, 1), 3.0)
@case
def training_flag(x):
    return F.dropout(x, 0.5, training=lin.training and False) + 1
@case
def amp_autocast_old(x):
    with torch.cpu.amp.autocast(dtype=torch.bfloat16):
        return lin(x).float()
@case
def tensor_methods_chain(x):
    return x.clamp(min=0).pow(2).mean(dim=-1, keepdim=True).sqrt().expand_as(x).contiguous()
@case
def boolean_mask_index(x):
    return x[x > 0].sum()
@case
def masked_fill_where(x):
    return x.masked_fill(x < 0, float("-inf")).softmax(-1)
@case
def list_of_tensors_stack(x):
    return torch.stack([x[:, i] for i in range(0, 8, 2)], dim=1)
@case
def f_interpolate(x):
    return F.interpolate(x[None, None], scale_factor=2, mode="nearest")[0, 0]
@case
def embedding_bag_like(x):
    idx = torch.tensor([0, 2, 3])
    return F.embedding(idx, x).sum(0)
@case
def cumsum_argsort(x):
    return x.cumsum(-1), x.argsort(-1), x.sort(-1).values
@case
def complex_slicing(x):
    return x[..., ::2] + x[:, 1::2], x[None, :, None].squeeze(), x[[0, 2]]
for name, f in cases.items():
    try:
        e = ember.explain(f)(x)
        with torch.no_grad():
            got = ember.compile(f)(x); want = f(x)
        leaves = lambda v: torch.utils._pytree.tree_leaves(v)
        ok = all((a.dtype == b.dtype and torch.allclose(a.float(), b.float(), atol=1e-2, rtol=1e-2, equal_nan=True)) if isinstance(a, torch.Tensor) else a == b for a, b in zip(leaves(got), leaves(want)))
        status = "OK " if e.graph_break_count == 0 and e.graph_count == 1 else "BRK"
        print(status, name, e.graph_count, e.graph_break_count, "match" if ok else "MISMATCH", [str(r)[-110:] for r in e.break_reasons][:2])
    except Exception as error:
        print("ERR", name, type(error).__name__, str(error)[:200])
