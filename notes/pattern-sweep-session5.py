import math, functools, warnings, logging, torch, ember
import torch.nn as nn, torch.nn.functional as F
import torch.utils.checkpoint as cp
log = logging.getLogger("x")
x = torch.randn(4, 8, 16)
cases = {}
def case(f): cases[f.__name__] = f; return f
@case
def assert_fstring(x):
    assert x.dim() == 3, f"bad {x.shape}"
    return x * x.shape[-1] ** -0.5
@case
def autocast_cpu(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x @ x.transpose(-1, -2)
    return y.float()
@case
def warn_and_log(x):
    if x.shape[0] > 100:
        warnings.warn("big")
    log.debug("shape %s", x.shape)
    return x + 1
@case
def jit_checks(x):
    if torch.jit.is_scripting() or torch.jit.is_tracing():
        return x
    if torch.compiler.is_compiling():
        return x * 3
    return x * 2
@case
def checkpointed(x):
    return cp.checkpoint(lambda t: t.relu() * 2, x, use_reentrant=False)
@case
def getattr_act(x):
    return getattr(F, "silu")(x) + getattr(torch, "tanh")(x)
@case
def partial_fn(x):
    f = functools.partial(F.softmax, dim=-1)
    return f(x)
@case
def try_except(x):
    try:
        y = x.view(-1, 3)
    except RuntimeError:
        y = x.reshape(-1)
    return y
@case
def loop_size(x):
    out = []
    for i in range(x.size(0)):
        out.append(x[i].sum())
    return torch.stack(out)
@case
def sdpa_boolmask(x):
    m = torch.ones(8, 8, dtype=torch.bool).tril()
    return F.scaled_dot_product_attention(x.unsqueeze(1), x.unsqueeze(1), x.unsqueeze(1), attn_mask=m)
@case
def einsum_and_chunk(x):
    a, b = x.chunk(2, dim=-1)
    return torch.einsum("bij,bkj->bik", a, b)
@case
def dict_kwargs(x, **kw):
    opts = dict(scale=2.0, **kw)
    return x * opts["scale"]
@case
def set_and_sorted(x):
    dims = sorted({2, 1})
    return x.sum(dim=dims)
@case
def string_ops(x):
    name = "layer_" + str(3)
    if name.startswith("layer"):
        return x.split([5, 11], dim=-1)[0]
    return x
@case
def nan_check(x):
    if torch.isnan(x).any():
        raise ValueError("nan")
    return x.exp()
@case
def inplace_views(x):
    y = x.clone()
    y[:, 0] += 1
    y.transpose(1, 2)[0].mul_(2)
    return y
@case
def tensor_creation(x):
    pos = torch.arange(x.shape[1], device=x.device)[None, :, None].float()
    return x + torch.zeros_like(x) + pos / 10 + torch.full((1,), 2.0)
@case
def type_promotion(x):
    return (x > 0).float() * 2 + (x.long() % 3).to(x.dtype)
@case
def module_in_closure(x):
    return lin(x)
lin = nn.Linear(16, 4)
@case
def enumerate_zip(x):
    ws = [1.0, 2.0]
    total = 0
    for i, (w, t) in enumerate(zip(ws, x.unbind(0)[:2])):
        total = total + w * t * i
    return total
@case
def no_grad_block(x):
    with torch.no_grad():
        s = x.mean()
    return x - s
@case
def item_use(x):
    n = int(x.shape[0])
    return x * float(n)
@case
def max_with_indices(x):
    v, i = x.max(dim=-1)
    return v, i, x.argmax(-1), torch.topk(x, 3).values
@case
def numel_math(x):
    return x / math.sqrt(x.numel())
for name, f in cases.items():
    try:
        e = ember.explain(f)(x)
        with torch.no_grad():
            got = ember.compile(f)(x); want = f(x)
        ok = all(torch.allclose(a.float(), b.float(), atol=1e-2, rtol=1e-2, equal_nan=True) for a, b in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)))
        status = "OK " if e.graph_break_count == 0 and e.graph_count == 1 else "BRK"
        print(status, name, e.graph_count, e.graph_break_count, "match" if ok else "MISMATCH", [str(r)[-110:] for r in e.break_reasons][:2])
    except Exception as error:
        print("ERR", name, type(error).__name__, str(error)[:200])
