"""The one exception family of keras-vllm.

Every error the package raises on bad input derives from `KerasVllmError`,
so callers can catch one type. Messages say what is wrong and what to do.
"""


class KerasVllmError(Exception):
    """Base class of every error raised by keras-vllm."""


class ExportError(KerasVllmError):
    """An export could not be written (bad target path, unwritable dir...)."""


class UnsupportedModelError(KerasVllmError):
    """The model is not a KerasHub `CausalLM` keras-vllm can export or serve."""


class ArtifactError(KerasVllmError):
    """An artifact is malformed: missing files, bad manifest, bad values."""


class IntegrityError(ArtifactError):
    """An artifact file does not match the checksum recorded at export."""


class SignatureError(IntegrityError):
    """An artifact's signature is missing or does not verify with the key
    (or certificate chain) the reader requires, or that key is unusable."""


class VersionSkewError(ArtifactError):
    """The artifact was written by an incompatible version of the format."""


class PresetUnavailableError(ArtifactError):
    """The preset a delta artifact references cannot be resolved here."""


class ServingError(KerasVllmError):
    """The artifact cannot be served with the requested settings."""


class RequestError(ServingError, ValueError):
    """A request carries input the served artifact does not take (an image
    for a text-only model, audio or video, more images than allowed, bytes
    that are not an image); the message names the problem and the fix. A
    `ValueError` too, so vLLM's OpenAI server answers 400 and keeps
    serving."""


class AccessError(ServingError):
    """A client may not use a keras-vllm route: it did not send the
    server's API key, or (on a server without one) it is not on the
    server's own host. Answered 401 or 403."""


class ConfigurationError(KerasVllmError, ValueError):
    """A setting keras-vllm reads (a `KERAS_VLLM_*` or other environment
    variable) has a value it does not accept; the message names the
    variable and what it accepts."""
