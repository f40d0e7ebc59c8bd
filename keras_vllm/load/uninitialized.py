"""Building a backbone whose variables get the artifact's values directly.

A backbone built from its config computes every variable's initializer
(random normals for each kernel) and the loader then overwrites them all
with the stored weights. On a host CPU that was most of the build: ~5 s of
a ~6 s build for a 128M-parameter model, in every engine start and every
`load_causal_lm` of a full export. Built under Keras' stateless scope with
`initialize_variables=False`, the variables are created without values (as
Keras does for symbolic builds) and `assign_values` gives each its stored
value as its first one; a variable the artifact does not store is then
initialized as usual.
"""

import contextlib


@contextlib.contextmanager
def values_deferred(enabled=True):
    """Variables created in this scope have no value until
    `assign_values` (or Keras) gives them one.

    Args:
        enabled: bool. False builds as usual (values computed at once).
    """
    if not enabled:
        yield
        return
    import keras
    from keras.src.backend.common import global_state

    pending = global_state.get_global_attribute("uninitialized_variables")
    before = len(pending or [])
    try:
        with keras.StatelessScope(initialize_variables=False):
            yield
    except BaseException:
        # A build that failed (a refused config) leaves no half-built
        # variables in Keras' list, which would keep them alive.
        pending = global_state.get_global_attribute("uninitialized_variables")
        _forget((pending or [])[before:])
        raise


def assign_values(backbone, values):
    """Gives `backbone` the restored `[(variable, value)]`.

    A variable built in `values_deferred` takes the value as its first one
    (with the layout Keras' distribution gives it, as its initializer's
    value would have); one with a value is assigned. Variables left without
    a value are then initialized by their initializers.
    """
    try:
        for variable, value in values:
            if _has_value(variable):
                variable.assign(value)
            else:
                variable._initialize(
                    variable._convert_to_tensor(value, dtype=variable.dtype)
                )
        for variable in backbone.variables:
            if not _has_value(variable):
                variable._deferred_initialize()
    finally:
        _forget([v for v in backbone.variables if _has_value(v)])


def fill(backbone, read_values):
    """Gives `backbone` the `[(variable, value)]` that `read_values()`
    returns (`assign_values`); a read that fails drops the backbone from
    Keras' list first (`forget`).

    Returns:
        The values read.
    """
    try:
        values = read_values()
    except BaseException:
        forget(backbone)
        raise
    assign_values(backbone, values)
    return values


def forget(backbone):
    """Drops a backbone that will not be used (its load failed) from
    Keras' list of variables to initialize, which would keep it alive."""
    _forget(backbone.variables)


def _forget(variables):
    from keras.src.backend.common import global_state

    pending = global_state.get_global_attribute("uninitialized_variables")
    if pending:
        dropped = {id(v) for v in variables}
        global_state.set_global_attribute(
            "uninitialized_variables",
            [v for v in pending if id(v) not in dropped],
        )


def _has_value(variable):
    return variable._value is not None
