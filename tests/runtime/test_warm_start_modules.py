"""What an nn.Module's identity guard used to stand for without a guard of its own — a
module container's length, truth, keys and members (`len(self.layers)`, `"b" in
self.blocks`, iterating a ModuleDict) — is guarded by its answer, read through the module's
source: a container changed between calls is captured again (it gave the old answer)."""

import torch

import ember


# -- in this process: what a module's identity guard no longer stands for ----------------
class _Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4)])
        self.extra = torch.nn.ModuleDict({"a": torch.nn.ReLU()})

    def forward(self, x):
        for name in self.extra:
            x = self.extra[name](x)
        if "b" in self.extra:
            x = x + 1
        return x * len(self.layers)


def test_a_module_container_s_length_keys_and_members_are_guarded():
    model = _Stack()
    compiled = ember.compile(model)
    x = torch.randn(2, 4)
    with torch.no_grad():
        assert torch.equal(compiled(x), model(x))
        model.layers.append(torch.nn.Linear(4, 4))  # (len: 1 -> 2)
        assert torch.equal(compiled(x), model(x))
        model.extra["b"] = torch.nn.Tanh()  # (`in`, and the keys iterated)
        assert torch.equal(compiled(x), model(x))
    assert len(compiled._compiled_forward.entries) == 3

