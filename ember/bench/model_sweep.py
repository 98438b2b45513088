"""Many real architectures, tiny and random, under ember.compile: does each compile whole and
answer as eager does? Beyond the zoo's eleven models (ember/bench/zoo.py), this is how ember
meets models nobody wrote a test for. The models, their batches and losses are listed in
ember/bench/model_sweep_models.py.

    python3 -m ember.bench.model_sweep [--only mistral swin]
        [--modes infer,train,decode,generate] [--json out.json] [--device cuda]

For each model and mode: graphs, graph breaks and eager islands (ember.explain, with the
first reasons), whether ember warned on its fallbacks channel, and the largest difference
from eager (logits in inference; the loss and every parameter's gradient after one backward
in training; relative where the answer passes 1; where that passes 1e-3, float64 judges).
On the CPU, float32, one call each: a correctness and coverage sweep, not a benchmark.

The causal LMs also decode greedily with a KV cache, twice over, as users write it with
transformers 5: `decode` compiles the model (`ember.compile(model)`) and runs the loop by
hand (the prompt with an empty DynamicCache, then one token a call with `past_key_values`);
`generate` compiles the model's forward (`model.forward = ember.compile(model.forward)`) and
calls `model.generate(do_sample=False)`. Checked: eager's tokens, how many captures the two
runs made (the prompt's and one for every cache length after it: two; at most
DECODE_COMPILES), and graphs, breaks and islands of the prompt's call and a cached token's.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import traceback
from collections.abc import Callable
from typing import Any

import torch

from ember.bench.model_sweep_models import SEED, cases, decoders

# decoding: tokens chosen per run, and the captures two runs may make in all (the prompt's,
# and the cached step's once the cache's length is a symbol; one more where a first cached
# step is captured statically before its length changes)
NEW_TOKENS = 8
DECODE_COMPILES = 3


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


TOLERANCE = 1e-3
# ember's float64 answer against eager's float64 answer, where float32 rounding alone may have
# moved a gradient (see run_case)
FLOAT64_TOLERANCE = 1e-8


def _answer(model: Any, batch: dict[str, Any], run: Callable, mode: str
            ) -> dict[str, torch.Tensor]:
    """What a call answers: the output and, in training, every parameter's gradient. Each
    call starts from the same random state, so a model that draws random numbers in its
    forward (ViTMAE's masking noise) draws the same ones under eager and under ember."""
    torch.manual_seed(SEED)
    output = run(model, batch)
    answer = {"output": output.detach()}
    if mode == "train":
        output.backward()
        parameters = getattr(model, "_orig_mod", model)
        answer.update((n, p.grad.clone()) for n, p in parameters.named_parameters()
                      if p.grad is not None)
        parameters.zero_grad(set_to_none=True)
    return answer


def _difference(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> float:
    """The largest difference, relative to each tensor's size where that passes 1 (a random
    model's logits reach 1e9 through Inception's eval-mode batch norms, where float32
    rounding alone differs in the thousands); a gradient eager has and ember lacks counts
    as zeros."""
    difference = 0.0
    for name, want in expected.items():
        have = got.get(name, torch.zeros_like(want)).to(want.dtype)
        scale = max(1.0, want.abs().max().item())
        difference = max(difference, (have - want).abs().max().item() / scale)
    return difference


class _NoJudge(Exception):
    """Eager raised on the float64 model (an op served in float32 and below only)."""


def _double(batch: dict[str, Any]) -> dict[str, Any]:
    return {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
            for k, v in batch.items()}


def run_case(name: str, make: Callable[[], tuple], mode: str, device: str = "cpu"
             ) -> dict[str, Any]:
    """One model in one mode: what explain says, the fallback warnings, eager's difference.
    Every call runs compiled (EMBER_EAGER_FIRST off: a call while kernels still compile
    would give eager's own answer to compare with eager's)."""
    from ember import config

    with config.override(eager_first=False):
        return _run_case(name, make, mode, device)


def build_case(make: Callable[[], tuple], found: dict[str, Any]) -> tuple | None:
    """The case's (model, batch, forward, loss); None where it cannot be built, said in
    found["status"]."""
    try:
        return make()
    except Exception as error:  # noqa: BLE001 (a config this transformers does not take)
        found["status"] = f"not built: {type(error).__name__}: {str(error)[:120]}"
        return None


def _run_case(name: str, make: Callable[[], tuple], mode: str, device: str
              ) -> dict[str, Any]:
    import ember

    found: dict[str, Any] = {"model": name, "mode": mode}
    case = build_case(make, found)
    if case is None:
        return found
    model, batch, forward, loss = case
    if device != "cpu":
        model = model.to(device)
        batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v
                 for k, v in batch.items()}
    if mode in ("decode", "generate"):
        return run_decoding(found, model, batch)
    model.train(mode == "train")
    run = forward if mode == "infer" else loss
    # (before any call: a float64 judge, below; RecurrentGemma keeps its recurrent states,
    # non-leaf tensors in training, on its modules, which deepcopy refuses)
    reference = copy.deepcopy(model)
    warnings = _Warnings()
    logging.getLogger("ember").addHandler(warnings)
    try:
        with torch.set_grad_enabled(mode == "train"):
            arguments, keywords = ((batch["x"],), {}) if "x" in batch else ((), batch)
            explained = ember.explain(model)(*arguments, **keywords)
            found.update(graphs=explained.graph_count, breaks=explained.graph_break_count,
                         reasons=[str(getattr(r, "reason", r))[:160]
                                  for r in explained.break_reasons[:3]],
                         islands=[str(i)[:160] for i in
                                  getattr(explained, "eager_islands", [])[:3]])
            expected = _answer(model, batch, run, mode)
            got = _answer(ember.compile(model), batch, run, mode)
            difference = _difference(got, expected)
            found["max_difference"] = difference
            found["status"] = "ok" if difference <= TOLERANCE else "DIFFERENT"
            if difference > TOLERANCE:
                # where they differ, float64 judges: a random model's training step can be
                # ill-conditioned enough (Xception's batch norms over 2x2 maps) that float32
                # rounding alone moves a gradient by 2%; ember is right where it is no
                # farther from float64's answer than eager is (twice, plus the tolerance)
                try:
                    exact = _answer(reference.double(), _double(batch), run, mode)
                except Exception as error:  # noqa: BLE001 (float64 not served: grouped_mm)
                    raise _NoJudge(str(error)[:80]) from error
                eager_error, ember_error = (_difference(a, exact) for a in (expected, got))
                found.update(eager_error=eager_error, ember_error=ember_error)
                if ember_error <= 2 * eager_error + TOLERANCE:
                    found["status"] = "ok (float64: eager's error as large)"
                else:
                    # one ReLU's input a rounding away from 0 (MobileNetV2's batch norm
                    # before a ReLU6 gave 4.6e-6 where eager gave -1.2e-6) flips that
                    # gradient's mask and every gradient before it moves by percents; a
                    # wrong formula stays wrong in float64, rounding does not: ember
                    # compiles the float64 model, and where its answer is float64's, the
                    # float32 difference is rounding's
                    double = copy.deepcopy(reference)
                    compiled = _answer(ember.compile(double), _double(batch), run, mode)
                    found["ember_float64_error"] = _difference(compiled, exact)
                    if found["ember_float64_error"] <= FLOAT64_TOLERANCE:
                        found["status"] = "ok (float64: ember's float64 answer is float64's)"
    except _NoJudge as error:
        found["status"] = f"DIFFERENT (eager cannot run float64 to judge: {error})"
    except Exception as error:  # noqa: BLE001 (a crash is a finding: say it, go on)
        found["status"] = f"CRASH: {type(error).__name__}: {str(error)[:200]}"
        found["trace"] = traceback.format_exc()[-1500:]
        try:
            with torch.set_grad_enabled(mode == "train"):
                run(model, batch)
        except Exception as eager_error:  # noqa: BLE001 (the sweep's config, not ember)
            found["status"] = f"eager raises too: {str(eager_error)[:100]}"
    finally:
        logging.getLogger("ember").removeHandler(warnings)
    found["warnings"] = [m[:200] for m in warnings.messages[:3]]
    return found


def greedy(model: Callable[..., Any], batch: dict[str, torch.Tensor],
           new_tokens: int = NEW_TOKENS) -> torch.Tensor:
    """Greedy decoding with a KV cache by hand, as users write the loop with transformers 5:
    the prompt with an empty DynamicCache (its layers as the config asks: sliding-window
    layers keep a Python int of their length), then the chosen token a call."""
    import transformers

    mask = batch["attention_mask"]
    cache = transformers.DynamicCache(config=model.config)
    output = model(input_ids=batch["input_ids"], attention_mask=mask, past_key_values=cache,
                   use_cache=True)
    chosen = [output.logits[:, -1].argmax(-1, keepdim=True)]
    for _ in range(new_tokens - 1):
        mask = torch.cat([mask, torch.ones_like(chosen[-1])], dim=1)
        output = model(input_ids=chosen[-1], attention_mask=mask,
                       past_key_values=output.past_key_values, use_cache=True)
        chosen.append(output.logits[:, -1].argmax(-1, keepdim=True))
    return torch.cat(chosen, dim=1)


def generated(model: torch.nn.Module, batch: dict[str, torch.Tensor],
              new_tokens: int = NEW_TOKENS) -> torch.Tensor:
    return model.generate(batch["input_ids"], attention_mask=batch["attention_mask"],
                          do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens)


def captures(compiled: Any, seen: set[int] | None = None) -> dict[str, int]:
    """How many captures a compiled function (or module) made, its resume functions' and the
    functions it compiled apart included, and how many of their graphs run eagerly. (A
    resume function of a break inside a loop resumes into itself: each is counted once.)"""
    from ember.backends import EagerGraph

    seen = set() if seen is None else seen
    function = getattr(compiled, "_compiled_forward", compiled)
    found = {"captures": 0, "eager": 0}
    if id(function) in seen:
        return found
    seen.add(id(function))
    found = {"captures": len(function.records),
             "eager": sum(isinstance(r.compiled, EagerGraph) for r in function.records)}
    inner = [r.compiled for r in function.resumes.values() if r.compiled is not None]
    for part in [*inner, *function.callees.values()]:
        for key, count in captures(part, seen).items():
            found[key] += count
    return found


def run_decoding(found: dict[str, Any], model: torch.nn.Module,
                 batch: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Greedy decoding (found["mode"]: decode by hand or generate), eager and compiled, twice
    each: the tokens, the captures, and what explain makes of the prompt's and a cached
    token's call."""
    import transformers

    import ember

    mode = found["mode"]
    model.eval()
    batch = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    warnings = _Warnings()
    logging.getLogger("ember").addHandler(warnings)
    try:
        with torch.no_grad():
            prompt = dict(batch, use_cache=True,
                          past_key_values=transformers.DynamicCache(config=model.config))
            cache = model(**prompt).past_key_values
            token = batch["input_ids"][:, -1:]
            step = dict(input_ids=token, past_key_values=cache, use_cache=True,
                        attention_mask=torch.cat([batch["attention_mask"],
                                                  torch.ones_like(token)], dim=1))
            prompt["past_key_values"] = transformers.DynamicCache(config=model.config)
            calls = [ember.explain(model)(**keywords) for keywords in (prompt, step)]
            found.update(graphs=max(c.graph_count for c in calls),
                         breaks=sum(c.graph_break_count for c in calls),
                         reasons=[str(getattr(r, "reason", r))[:160]
                                  for c in calls for r in c.break_reasons][:3],
                         islands=[str(i)[:160] for c in calls
                                  for i in getattr(c, "eager_islands", [])][:3])
            if mode == "decode":
                expected = greedy(model, batch)
                compiled = ember.compile(model)
                runs = [greedy(compiled, batch) for _ in range(2)]
            else:
                expected = generated(model, batch)
                compiled = ember.compile(model.forward)
                model.forward = compiled
                try:
                    runs = [generated(model, batch) for _ in range(2)]
                finally:
                    del model.forward
        counted = captures(compiled)
        found.update(compiles=counted["captures"], eager_graphs=counted["eager"],
                     tokens=int(expected.numel()),
                     max_difference=max(int((run != expected).sum()) for run in runs))
        if found["max_difference"]:
            found["status"] = "DIFFERENT"
        elif warnings.messages:
            found["status"] = "FALLBACK: " + warnings.messages[0][:100]
        elif counted["captures"] > DECODE_COMPILES:
            found["status"] = f"RECOMPILES: {counted['captures']} captures"
        else:
            found["status"] = "ok"
    except Exception as error:  # noqa: BLE001 (a crash is a finding: say it, go on)
        found["status"] = f"CRASH: {type(error).__name__}: {str(error)[:200]}"
        found["trace"] = traceback.format_exc()[-1500:]
        try:  # (RecurrentGemma answers no cache: the loop fails in eager too)
            with torch.no_grad():
                greedy(model, batch)
        except Exception as eager_error:  # noqa: BLE001 (the sweep's loop, not ember)
            found["status"] = f"eager raises too: {str(eager_error)[:100]}"
    finally:
        logging.getLogger("ember").removeHandler(warnings)
    found["warnings"] = [m[:200] for m in warnings.messages[:3]]
    return found


def summary(result: dict[str, Any]) -> str:
    """One line per model and mode (and, decoding, the captures the two runs made)."""
    difference = result.get("max_difference")
    line = (f"{result['model']:24} {result['mode']:8} {result.get('status', '?')[:60]:60} "
            f"graphs {result.get('graphs', '-')} breaks {result.get('breaks', '-')} "
            f"islands {len(result.get('islands', []))} "
            f"warnings {len(result.get('warnings', []))} "
            f"diff {'-' if difference is None else format(difference, '.2g')}")
    if "compiles" in result:
        line += f" compiles {result['compiles']} (eager {result['eager_graphs']})"
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--modes", default="infer,train")
    parser.add_argument("--json", default=None, help="write every result here")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda: the models and "
                        "batches moved there after they are made (float32 still)")
    options = parser.parse_args()
    results = []
    decoding = decoders()
    for name, make in cases().items():
        if options.only and name not in options.only:
            continue
        for mode in options.modes.split(","):
            if mode in ("decode", "generate") and name not in decoding:
                continue
            result = run_case(name, make, mode, options.device)
            results.append(result)
            print(summary(result), flush=True)
            for line in result.get("reasons", []) + result.get("islands", []) + \
                    result.get("warnings", []):
                print(f"    {line}")
    if options.json:
        with open(options.json, "w") as file:
            json.dump(results, file, indent=1)
    runs = [r for r in results if not str(r.get("status", "")).startswith(("eager raises",
                                                                          "not built"))]
    ok = sum(str(r.get("status")).startswith("ok") for r in runs)
    whole = sum(r.get("graphs") == 1 and not r.get("islands") for r in runs)
    print(f"{ok}/{len(runs)} match eager; {whole}/{len(runs)} one graph without islands "
          f"({len(results) - len(runs)} runs left out: the model or eager fails as configured)")


if __name__ == "__main__":
    main()
