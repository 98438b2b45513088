"""Test support: a model's outputs kept as Hugging Face's ModelOutput keeps them (a dict
subclass with its own __setattr__ and __setitem__), written for ember's tests."""

from __future__ import annotations

import collections
import dataclasses

import torch


class ModelOutputs(collections.OrderedDict):
    """A model's outputs as Hugging Face's ModelOutput keeps them: a dataclass whose fields
    that are not None are also its items, in field order; writing either one writes both;
    an int or a slice indexes the items' tuple; dict's mutators are refused."""

    def __post_init__(self):
        for field in dataclasses.fields(self):
            if getattr(self, field.name) is not None:
                self[field.name] = getattr(self, field.name)

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        super().__setattr__(key, value)

    def __setattr__(self, name, value):
        if value is not None and name in self.keys():
            super().__setitem__(name, value)
        super().__setattr__(name, value)

    def __getitem__(self, key):
        return dict(self.items())[key] if isinstance(key, str) else self.to_tuple()[key]

    def to_tuple(self):
        return tuple(self[name] for name in self.keys())

    def pop(self, *args, **kwargs):
        raise RuntimeError(f"{type(self).__name__} cannot pop")


@dataclasses.dataclass
class LMOutputs(ModelOutputs):
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    hidden: tuple | None = None
