"""Random pointwise chains with a symbolic leading dim (issue 18, stage 2): compiled once for
every batch size, each call equal to eager's."""

import torch
from hypothesis import given
from property.strategies import examples, pointwise_chains

import ember
from ember.shapes import ShapeSpecialized


@examples(8)
@given(pointwise_chains())
def test_a_pointwise_chain_over_a_symbolic_batch_matches_eager(chain):
    source, width = chain
    namespace = {"torch": torch}
    exec(source, namespace)  # noqa: S102 (a generated test program)
    fn = namespace["f"]
    compiled = ember.compile(fn)
    w = torch.randn(width, generator=torch.Generator().manual_seed(1))
    for batch in (2, 5, 11):
        x = torch.randn(batch, width, generator=torch.Generator().manual_seed(batch))
        ember.mark_dynamic(x, 0)
        torch.testing.assert_close(compiled(x, w), fn(x, w), rtol=1e-5, atol=1e-5)
    assert len(compiled.records) == 1
    assert not isinstance(compiled.records[0].compiled, ShapeSpecialized)
