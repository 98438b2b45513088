"""ember-compiled models under DistributedDataParallel and FSDP (fully_shard): two CPU ranks
over gloo (or, with EMBER_TEST_DEVICE=cuda and two GPUs, two GPU ranks over NCCL) train 10 SGD
steps each way; ember's parameters must equal eager's, and DDP's must agree across ranks."""

import os
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).parent))
import ranks  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(),
                                reason="torch.distributed is not built in")
MODELS = ("mlp", "block")
WAYS = ("ddp", "ddp(ember)", "ember(ddp)", "step(ddp)", "fsdp", "fsdp(ember)", "ember(fsdp)",
        "step(fsdp)")
NCCL = os.environ.get("EMBER_TEST_DEVICE", "cpu") == "cuda" and torch.cuda.device_count() >= 2
# (on GPUs ember's fused small matmuls compute in three-pass TF32: float32-level error, not
# cuBLAS's rounding, over 10 steps)
TOLERANCE = dict(rtol=1e-3, atol=1e-4) if NCCL else dict(rtol=1e-4, atol=1e-5)
# graphs of the model's compiled modules, each compiled once in the 10 steps (no recompiles):
# one for the model; under FSDP one per sharded part, and for a whole compiled step also the
# root's forward (one graph before it breaks at its first sharded part)
GRAPHS = {("mlp", "fsdp(ember)"): 3, ("block", "fsdp(ember)"): 2,
          ("mlp", "ember(fsdp)"): 4, ("block", "ember(fsdp)"): 3,
          ("mlp", "step(fsdp)"): 4, ("block", "step(fsdp)"): 3}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Both ranks' results for every model and way, from one spawn of two processes."""
    folder = tmp_path_factory.mktemp("ranks")
    cases = [(name, how) for name in MODELS for how in WAYS]
    mp.spawn(ranks.run, args=(2, f"file://{folder / 'init'}", str(folder), cases,
                              "nccl" if NCCL else "gloo"), nprocs=2)
    return [torch.load(folder / f"rank{r}.pt") for r in range(2)]


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("ours, theirs", [("ddp(ember)", "ddp"), ("ember(ddp)", "ddp"),
                                          ("step(ddp)", "ddp"), ("fsdp(ember)", "fsdp"),
                                          ("ember(fsdp)", "fsdp"), ("step(fsdp)", "fsdp")])
def test_ember_trains_as_eager_does_under_ddp_and_fsdp(trained, name, ours, theirs):
    for rank, results in enumerate(trained):
        got, want = results[f"{name} {ours}"], results[f"{name} {theirs}"]
        # one graph per compiled module, compiled once in 10 steps (no recompiles)
        assert got["graphs"] == GRAPHS.get((name, ours), 1), f"rank {rank}: {got['graphs']}"
        torch.testing.assert_close(got["losses"], want["losses"], **TOLERANCE)
        assert got["params"].keys() == want["params"].keys()
        for path in want["params"]:
            where = f"rank {rank} {path}"
            torch.testing.assert_close(got["params"][path], want["params"][path], **TOLERANCE,
                                       msg=lambda m, where=where: f"{where}: {m}")


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("how", WAYS)
def test_every_rank_ends_with_the_same_parameters(trained, name, how):
    first, second = (results[f"{name} {how}"]["params"] for results in trained)
    for path in first:
        assert torch.equal(first[path], second[path]), path
    # (and each rank trained on its own data: the losses differ)
    assert not torch.equal(trained[0][f"{name} {how}"]["losses"],
                           trained[1][f"{name} {how}"]["losses"])
