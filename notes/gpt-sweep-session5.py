import math, dataclasses, collections, torch, ember
import torch.nn as nn, torch.nn.functional as F
from typing import Optional

@dataclasses.dataclass
class Config:
    vocab: int = 50; dim: int = 32; heads: int = 4; layers: int = 2; max_pos: int = 16
    dropout: float = 0.0; act: str = "gelu_new"

class Output(collections.OrderedDict):
    pass

ACT = {"gelu": F.gelu, "gelu_new": lambda x: 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))}

class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.c_attn = nn.Linear(cfg.dim, 3 * cfg.dim)
        self.c_proj = nn.Linear(cfg.dim, cfg.dim)
        self.register_buffer("bias", torch.tril(torch.ones(cfg.max_pos, cfg.max_pos, dtype=torch.bool)).view(1, 1, cfg.max_pos, cfg.max_pos), persistent=False)
        self.head_dim = cfg.dim // cfg.heads
    def _split(self, t):
        new_shape = t.size()[:-1] + (self.cfg.heads, self.head_dim)
        return t.view(new_shape).permute(0, 2, 1, 3)
    def forward(self, x, mask: Optional[torch.Tensor] = None, past=None, use_cache=False):
        q, k, v = self.c_attn(x).split(self.cfg.dim, dim=2)
        q, k, v = map(self._split, (q, k, v))
        if past is not None:
            k = torch.cat((past[0], k), dim=-2); v = torch.cat((past[1], v), dim=-2)
        present = (k, v) if use_cache else None
        w = torch.matmul(q, k.transpose(-1, -2)) / (v.size(-1) ** 0.5)
        qlen, klen = q.size(-2), k.size(-2)
        causal = self.bias[:, :, klen - qlen:klen, :klen]
        w = torch.where(causal, w, torch.tensor(torch.finfo(w.dtype).min, dtype=w.dtype, device=w.device))
        if mask is not None:
            w = w + mask
        w = nn.functional.softmax(w, dim=-1)
        o = torch.matmul(w, v).permute(0, 2, 1, 3).contiguous()
        o = o.view(o.size()[:-2] + (self.cfg.dim,))
        return self.c_proj(o), present

class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.dim, eps=1e-5); self.attn = Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.dim); self.fc = nn.Linear(cfg.dim, 4 * cfg.dim); self.proj = nn.Linear(4 * cfg.dim, cfg.dim)
        self.act = ACT[cfg.act]
    def forward(self, x, **kwargs):
        a, present = self.attn(self.ln_1(x), **kwargs)
        x = x + a
        x = x + self.proj(self.act(self.fc(self.ln_2(x))))
        return (x, present)

class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab, cfg.dim); self.wpe = nn.Embedding(cfg.max_pos, cfg.dim)
        self.h = nn.ModuleList([Block(cfg) for _ in range(cfg.layers)])
        self.ln_f = nn.LayerNorm(cfg.dim)
    def forward(self, input_ids, attention_mask=None, use_cache=False, return_dict=True):
        b, t = input_ids.shape
        pos = torch.arange(0, t, dtype=torch.long, device=input_ids.device).unsqueeze(0)
        if attention_mask is not None:
            attention_mask = attention_mask[:, None, None, :].to(dtype=self.wte.weight.dtype)
            attention_mask = (1.0 - attention_mask) * torch.finfo(self.wte.weight.dtype).min
        x = self.wte(input_ids) + self.wpe(pos)
        presents = () if use_cache else None
        for i, block in enumerate(self.h):
            x, present = block(x, mask=attention_mask, use_cache=use_cache)
            if use_cache:
                presents = presents + (present,)
        x = self.ln_f(x)
        logits = x @ self.wte.weight.T
        if not return_dict:
            return (logits, presents)
        return Output(logits=logits, past_key_values=presents)

torch.manual_seed(0)
cfg = Config()
m = GPT(cfg).eval()
ids = torch.randint(0, 50, (2, 10)); mask = torch.ones(2, 10); mask[0, :3] = 0
for kw in (dict(), dict(attention_mask=mask), dict(attention_mask=mask, use_cache=True), dict(return_dict=False)):
    e = ember.explain(m)(ids, **kw)
    c = ember.compile(m)
    with torch.no_grad():
        got, want = c(ids, **kw), m(ids, **kw)
    gl = got["logits"] if isinstance(got, dict) else got[0]
    wl = want["logits"] if isinstance(want, dict) else want[0]
    print(kw.keys(), "graphs", e.graph_count, "breaks", e.graph_break_count, [str(r)[:150] for r in e.break_reasons][:3], "err", (gl - wl).abs().max().item(), type(got).__name__)
# training
m.train()
c = ember.compile(m)
out = c(ids, attention_mask=mask)["logits"].sum(); out.backward()
g1 = [p.grad.clone() for p in m.parameters()]; m.zero_grad()
m(ids, attention_mask=mask)["logits"].sum().backward()
print("train grad err", max((a - p.grad).abs().max().item() for a, p in zip(g1, m.parameters())))
