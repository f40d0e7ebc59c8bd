"""Decides whether vLLM should serve on JAX CPU devices, without touching JAX.

vLLM's default engine mode forks an EngineCore process. If JAX has started a
backend (even just `jax.devices()`) in the parent before that fork, the child
aborts (`mutex.cc ... Check w->waitp->cv_word == nullptr failed`). So this
module only reads environment variables and device files.

Signals, in order (the first that applies wins):

1. `KERAS_VLLM_DEVICE=cpu|tpu`: explicit override.
2. `JAX_PLATFORMS`: exactly `cpu` means JAX will only ever see CPU devices,
   so the CPU backend is the only option; a value naming `tpu` or `proxy`
   (Pathways) means the user wants the TPU.
3. `VLLM_TPU_USING_PATHWAYS` set: the TPUs are remote (Pathways), so nothing
   is visible locally but it is still a TPU deployment.
4. Local TPU hardware: a PCI device with Google's vendor id `0x1ae0` and a
   known TPU device id under `/sys/bus/pci/devices` (the same table
   `tpu_info.device` uses; Google's gVNIC NIC shares the vendor id, hence the
   device-id check), or a `/dev/accel<N>` node (the TPU v2-v4 driver; the
   kernel's generic accel subsystem uses the directory `/dev/accel/`, which
   is not matched).
5. `TPU_ACCELERATOR_TYPE` set: Cloud TPU VMs and GKE TPU pods export it, and
   containers may hide `/sys`.
6. Otherwise: CPU.
"""

import glob
import logging
import multiprocessing
import os
import re

from keras_vllm import envs

logger = logging.getLogger("keras_vllm")
_announced = False

_CPU = "cpu"

# vLLM's class path of tpu-inference's platform (vllm-tpu 0.32.0).
TPU_PLATFORM_CLASS = "tpu_inference.platforms.tpu_platform.TpuPlatform"

_GOOGLE_PCI_VENDOR = "0x1ae0"
# PCI device ids of TPU chips (v2/v3 share 0x0027), from tpu_info.device.
_TPU_PCI_DEVICES = {"0x0027", "0x005e", "0x0062", "0x0063", "0x006f",
                    "0x0076"}


def is_cpu_host():
    """Whether keras-vllm should run vLLM's TPU backend on JAX CPU devices.

    Never initializes JAX (see the module docstring for the signals used).

    Returns:
        True when no TPU is usable here (or `KERAS_VLLM_DEVICE=cpu`).

    Raises:
        ValueError: `KERAS_VLLM_DEVICE` is set to something other than
            `cpu`, `tpu` or empty (see `keras_vllm/envs.py`).
    """
    forced = envs.DEVICE.get()
    if forced is not None:
        return forced == _CPU

    jax_platforms = envs.jax_platforms()
    if jax_platforms == _CPU:
        return True
    if re.search(r"\b(tpu|proxy)\b", jax_platforms):
        return False
    if envs.tpu_using_pathways():
        return False
    if _has_local_tpu():
        return False
    if envs.tpu_accelerator_type():
        return False
    return True


def _has_local_tpu():
    """Whether TPU chips are attached to this machine (PCI or /dev/accelN)."""
    for device in glob.glob("/sys/bus/pci/devices/*"):
        try:
            with open(os.path.join(device, "vendor")) as f:
                if f.read().strip() != _GOOGLE_PCI_VENDOR:
                    continue
            with open(os.path.join(device, "device")) as f:
                if f.read().strip() in _TPU_PCI_DEVICES:
                    return True
        except OSError:
            continue
    return any(
        re.fullmatch(r"/dev/accel\d+", path)
        for path in glob.glob("/dev/accel*"))


def announced_elsewhere():
    """Keeps this process from saying that the CPU backend is on: another
    process of the same run said it (the engine fork server's parent)."""
    global _announced
    _announced = True


def platform_class_path():
    """The vLLM platform to use on this host, for a `vllm.platform_plugins`
    entry point.

    On a CPU host it selects tpu-inference's `TpuPlatform` (vLLM would
    otherwise pick it only when `import libtpu` works, and JAX would then try
    to initialize libtpu) and sets `JAX_PLATFORMS=cpu` unless the user set
    it (an empty value counts as unset). It logs one line saying the CPU
    backend is active.

    Returns:
        `"tpu_inference.platforms.tpu_platform.TpuPlatform"` on a CPU host;
        None on a TPU host, so vLLM's own TPU detection runs.
    """
    if not is_cpu_host():
        return None
    # An empty JAX_PLATFORMS means "auto" to JAX, which would try libtpu
    # (installed with tpu-inference) first; treat it like unset.
    if not envs.jax_platforms():
        envs.JAX_PLATFORMS.set(_CPU)
    # WARNING level: the line must be visible without logging configuration
    # (vLLM only configures its own "vllm" logger), and CPU serving is a
    # test/development mode, not a production one.
    global _announced
    # A spawned child names itself before it imports anything, and only
    # later learns its parent; a forked one knows both.
    child = (
        multiprocessing.parent_process() is not None
        or multiprocessing.current_process().name != "MainProcess"
    )
    if _announced or child:
        # Said once: vLLM resolves its platform more than once per process,
        # and the process that started vLLM's engine processes said it.
        return TPU_PLATFORM_CLASS
    _announced = True
    logger.warning(
        "keras-vllm: no TPU found (or %s=cpu); serving with tpu-inference on "
        "JAX CPU devices (JAX_PLATFORMS=%s).", envs.DEVICE.name,
        envs.JAX_PLATFORMS.raw())
    return TPU_PLATFORM_CLASS
