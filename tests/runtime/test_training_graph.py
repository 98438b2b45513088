"""ember.runtime.training.TrainingGraph: the backward compiled on a thread is taken in once,
whoever asks for it first."""

import concurrent.futures
from types import SimpleNamespace

from ember.runtime.training import TrainingGraph


def _graph(pending: concurrent.futures.Future, start) -> TrainingGraph:
    split = SimpleNamespace(backward_inputs=[], differentiable_outputs=[],
                            forward=SimpleNamespace(outputs=[], symbols=()))
    forward = SimpleNamespace(fallback_count=0)
    return TrainingGraph(forward, pending, split, specs=[], output_tree=None, output_count=0,
                         tensor_positions=[], extras=[], label="graph_test", eager=None,
                         start_backward=start)


def test_the_backward_is_taken_in_once_when_another_reader_takes_it_first():
    # The warm cache's thread reads backward_graph while a backward's first call reads it: the
    # second reader must find the compiled backward, not call result() on it (JetMoE's
    # training step raised AttributeError: 'CompiledGraph' object has no attribute 'result').
    pending = concurrent.futures.Future()
    compiled = object()
    pending.set_result(compiled)
    graph = None

    def start():  # (starting the compile: here the other reader comes in meanwhile)
        assert graph.backward_graph is compiled

    graph = _graph(pending, start)
    assert graph.backward_graph is compiled
    assert graph.backward_graph is compiled and graph.backward_compiled


def test_a_wrapper_given_before_the_backward_is_in_wraps_it_once():
    pending = concurrent.futures.Future()
    graph = _graph(pending, None)
    graph.wrap_backward(lambda backward: ("wrapped", backward))
    pending.set_result("backward")
    assert graph.backward_graph == ("wrapped", "backward")
    assert graph.backward_graph == ("wrapped", "backward")
