"""Which classes an artifact names, and which config keys they take.

Reflection only: nothing is built and JAX is not started, so the engine
runs these checks before vLLM forks, and the tokenizer adapter in vLLM's
front-end processes.
"""

from keras_vllm.hub import classes
from keras_vllm.hub import pairings
from keras_vllm.errors import ArtifactError


# Keyword arguments every Keras layer accepts besides its own.
_LAYER_KWARGS = ("name", "dtype", "trainable")


def _accepted_keywords(cls):
    """The keyword arguments `cls(...)` accepts: its constructor's named
    parameters and, while a constructor passes `**kwargs` on, its bases'
    (up to Keras' `Layer`, whose keywords are `_LAYER_KWARGS`)."""
    import inspect

    accepted = set(_LAYER_KWARGS)
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        if klass.__module__.startswith("keras.") or klass is object:
            break
        params = inspect.signature(init).parameters.values()
        accepted |= {
            p.name
            for p in params
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        }
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return accepted - {"self"}


# Keywords keras-hub's base classes pop from `**kwargs` by name.
_POPPED_KWARGS = {"tokenizer": ("config_file",), "preprocessor": ("config_file",)}


def check_config_keys(cls, config, role):
    """Checks a config's keys against what its class's constructor takes
    (reflection only: nothing is built, JAX is not started), so no field
    reaches a `**kwargs` that another class would interpret.

    Raises:
        ArtifactError: naming the role, the key and the class.
    """
    allowed = _accepted_keywords(cls) | set(_POPPED_KWARGS.get(role, ()))
    unknown = sorted(set(config) - allowed)
    if unknown:
        raise ArtifactError(
            f"The artifact's {role} config has '{unknown[0][:100]}', which "
            f"{cls.__name__} does not take. The manifest was altered or "
            "written by another keras-hub; re-export the model."
        )


def check_backbone_config(cls, config):
    """Checks a backbone config's keys against its class's constructor
    (reflection only: nothing is built, JAX is not started)."""
    import inspect

    check_config_keys(cls, config, "backbone")
    params = inspect.signature(cls.__init__).parameters
    required = sorted(
        name
        for name, p in params.items()
        if name != "self"
        and p.default is p.empty
        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and name not in config
    )
    if required:
        raise ArtifactError(
            f"The artifact's backbone config lacks '{required[0]}', which "
            f"{cls.__name__} needs; re-export the model."
        )


def resolve_classes(manifest):
    """Resolves every class of the artifact against the allowlist and checks
    that the task takes the backbone (`keras_vllm.hub.pairings`, the rule
    export applies before it writes). Whether the preprocessor takes the
    tokenizer needs the tokenizer's assets: `keras_loader.load_tokenizer`
    checks it.

    Returns:
        `{role: class}`.
    """
    resolved = {
        role: classes.resolve(manifest[role]["registered_name"], role)
        for role in ("backbone", "causal_lm", "tokenizer", "preprocessor", "sampler")
    }
    problem = pairings.backbone_problem(
        resolved["causal_lm"], resolved["backbone"]
    )
    if problem is not None:
        raise ArtifactError(
            f"The artifact pairs a {resolved['causal_lm'].__name__} with a "
            f"{resolved['backbone'].__name__}: {problem}. Export refuses "
            "such a model, so the manifest was altered; re-export the model."
        )
    check_backbone_config(resolved["backbone"], manifest["backbone"]["config"])
    for role in ("tokenizer", "preprocessor", "sampler"):
        check_config_keys(resolved[role], manifest[role]["config"], role)
    return resolved
