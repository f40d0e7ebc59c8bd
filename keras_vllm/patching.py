"""The one way keras-vllm replaces a function of vLLM, tpu-inference or keras-hub.

keras-vllm serves through private functions of exactly the serving stack it
pins (`PINNED_VERSIONS`): the CPU backend (`keras_vllm/cpu/`), runner fixes
for tpu-inference 0.32.0, vLLM front-end checks, the keras-hub hooks. Every
such replacement goes through `replace()`, which

- is idempotent per fix: a function already replaced by the same `make`
  is left alone (a plugin loaded twice, an engine started twice in one
  process);
- stacks fixes: a second, different `make` for the same function wraps
  the first replacement, so both apply (before, the second was silently
  dropped, and a fix that depended on it never ran);
- marks the replacement with one attribute (`MARKER`) that holds the
  function it replaced, so that `original_of()`, `upstream_of()` and the
  tests can find every one;
- optionally rebinds copies: `from m import f` binds the object in the
  importing module, so replacing `m.f` alone would not reach them
  (`everywhere="tpu_inference"`).

To replace an upstream function: call `replace()` from the module that owns
the fix (under `serve/` or `cpu/`), say in its docstring which upstream
function of which pinned version it replaces and what fails without it, and
add its test; `tests/test_layout.py` fails on a replacement made any other
way. `check_versions()` runs wherever the serving side starts
(`keras_vllm.serve.plugin.register`), so a different vLLM or tpu-inference
is one clear error instead of a failure deep inside a private function.
"""

import importlib.metadata
import sys
import weakref

from keras_vllm.errors import ServingError

# The versions whose private functions keras-vllm replaces.
PINNED_VERSIONS = {"tpu-inference": "0.32.0", "vllm-tpu": "0.32.0"}

# The attribute of every replacement that holds the function it replaced.
MARKER = "__keras_vllm_replaces__"
# The attribute of every replacement that names the `make` that built it.
MAKER = "__keras_vllm_made_by__"

# The "original" of an attribute keras-vllm adds.
ADDED = "added by keras-vllm"

# "module.Owner.name" of every replacement made in this process.
_REPLACED = {}
# "module.Owner().name" of replacements on one object (an engine's runner):
# held weakly, so that the record does not keep the object, and with it the
# engine's KV cache and weights, alive after the engine shuts down.
_REPLACED_ON_OBJECTS = weakref.WeakValueDictionary()


def installed_version(package):
    """The installed version of `package`, or None."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_versions():
    """Raises unless the pinned vllm-tpu and tpu-inference are installed.

    Raises:
        ServingError: a package is missing or has another version; the
            message names both versions and the install command.
    """
    for package, required in PINNED_VERSIONS.items():
        installed = installed_version(package)
        if installed != required:
            found = (
                "it is not installed" if installed is None
                else f"{installed} is installed"
            )
            raise ServingError(
                f"keras-vllm serves with {package}=={required}, but {found}. "
                'Install the pinned serving stack: pip install '
                '"keras-vllm[serving]"'
            )


def _function(value):
    # A classmethod or staticmethod carries the marker on its function.
    return getattr(value, "__func__", value)


def original_of(value):
    """The function `value` replaced, or None if it is not a replacement."""
    return getattr(_function(value), MARKER, None)


def is_replacement(value):
    return original_of(value) is not None


def upstream_of(value):
    """The upstream function under every replacement of `value` (`value`
    itself if it is none)."""
    while is_replacement(value) and original_of(value) is not ADDED:
        value = original_of(value)
    return value


def _maker_key(make):
    # A `make` defined once is one fix, however many closures of it a
    # caller creates: keyed by where its code is, not by the object.
    code = getattr(make, "__code__", None)
    if code is None:
        return f"{type(make).__module__}.{type(make).__qualname__}"
    return f"{code.co_filename}:{code.co_firstlineno}:{code.co_name}"


def _made_by(value, key):
    while is_replacement(value) and original_of(value) is not ADDED:
        if getattr(_function(value), MAKER, None) == key:
            return True
        value = original_of(value)
    return False


def replace(owner, name, make, everywhere=None):
    """Replaces `owner.name` by `make(current)`, once per `make`.

    A `make` that already replaced `owner.name` (directly or under another
    fix stacked on it) is not applied again; a different one wraps what is
    there, so every fix of a function applies, the latest outermost.

    Args:
        owner: the module or class that holds the function.
        name: the attribute's name.
        make: called with the current value (for a class, as stored in its
            `__dict__`: a classmethod stays a classmethod), returns the
            replacement.
        everywhere: a module-name prefix (e.g. `"tpu_inference"`): every
            loaded module under it that bound the original by name gets
            the replacement too.

    Returns:
        The replacement now in place (the existing one if this `make`
        replaced `owner.name` already).

    Example:

    ```python
    def make(original):
        def quiet(*args, **kwargs):
            return original(*args, **kwargs)
        return quiet

    patching.replace(some_module, "noisy", make)
    ```
    """
    current = vars(owner).get(name) if isinstance(owner, type) else None
    if current is None:
        current = getattr(owner, name)
    key = _maker_key(make)
    if _made_by(current, key):
        return current
    replacement = make(current)
    setattr(_function(replacement), MARKER, current)
    setattr(_function(replacement), MAKER, key)
    setattr(owner, name, replacement)
    if everywhere is not None:
        _rebind(current, replacement, everywhere)
    _record(owner, name, replacement)
    return replacement


def add(owner, name, value):
    """Adds `owner.name` (a method upstream does not have), once.

    Marked like a replacement (its original is `ADDED`), so that it is
    listed with them; an attribute upstream already has is refused.
    """
    current = getattr(owner, name, None)
    if current is not None:
        if original_of(current) is ADDED:
            return current
        raise ServingError(
            f"{_owner_name(owner)} already has '{name}': keras-vllm would "
            "replace it. Install the pinned versions of its dependencies."
        )
    setattr(_function(value), MARKER, ADDED)
    setattr(owner, name, value)
    _record(owner, name, value)
    return value


def replacements():
    """`{"module.Owner.name": replacement}` of what this process replaced
    (and still holds, for replacements on one object)."""
    return {**_REPLACED, **_REPLACED_ON_OBJECTS}


def _record(owner, name, value):
    key = f"{_owner_name(owner)}.{name}"
    if isinstance(owner, type) or hasattr(owner, "__name__"):
        _REPLACED[key] = value
    else:
        # A replacement on one object references the method it replaced,
        # bound to that object (`MARKER`).
        _REPLACED_ON_OBJECTS[key] = value


def _owner_name(owner):
    if isinstance(owner, type):
        return f"{owner.__module__}.{owner.__qualname__}"
    if hasattr(owner, "__name__"):  # a module
        return owner.__name__
    # An instance (one engine's object): named by its class.
    cls = type(owner)
    return f"{cls.__module__}.{cls.__qualname__}()"



def _rebind(original, replacement, prefix):
    for module_name, module in list(sys.modules.items()):
        if module is None or not module_name.startswith(prefix):
            continue
        for attr, value in list(vars(module).items()):
            if value is original:
                setattr(module, attr, replacement)
