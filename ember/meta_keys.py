"""Keys of FX nodes' `meta` that ember writes itself, for more than one layer to read."""

# whether a node's example value required grad, where the FX graph was rebuilt from a record
# that keeps no example values (a warm start's entry: capture/records.py writes it; the
# lowering reads it for an attention call's operands, lower/meta_interpreter.py)
REQUIRES_GRAD = "ember_requires_grad"
