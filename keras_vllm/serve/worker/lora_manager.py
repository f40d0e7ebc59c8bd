"""The LoRA manager of a multi-adapter engine, in vLLM's worker.

vLLM's model runner drives LoRA through a worker manager
(`vllm.lora.worker_manager.WorkerLoRAManager`'s interface, which
tpu-inference's `TPUModelRunner` reaches through vLLM's
`LoRAModelRunnerMixin`): adapters are added by `LoRARequest` (a name, an
int id, a path), each step activates the adapters its tokens use, and the
warm-up registers dummy adapters. This manager implements that interface
over the adapter slots of the served projections
(`keras_vllm.layers.common.lora_slots`):

* an adapter is read from its keras-vllm adapter artifact (verified, and
  checked completely against the served base by `adapter_checks`) into
  host memory, up to `max_cpu_loras` of them, when vLLM adds it
  (`add_lora`: at start, `/v1/load_lora_adapter`, `engine.add_adapter`),
  where a refusal answers that call alone; `load_inplace` reads it again;
* an adapter evicted from host memory keeps its checked factors in a
  private spill file (read once: its artifact is never read again inside
  a scheduled step, where an error would stop the engine for everyone),
  and comes back from there when a step needs it;
* activating an adapter writes its factors, zero-padded to
  `max_lora_rank`, into a free slot (or the least recently used one no
  token of the step needs) with each variable's own sharding: the shapes
  stay those the step was compiled for;
* `token_slots` is each scheduled token's slot as a replicated JAX int32
  array, which `lora_runner` hands to the jitted step as its
  `lora_metadata`.

vLLM's scheduler never schedules more distinct adapters in one step than
`max_loras`; more are queued.
"""

import collections
import contextlib
import logging
import os
import tempfile

import jax.numpy as jnp
import numpy as np

from keras_vllm import format as fmt
from keras_vllm.hub import checkpoint
from keras_vllm.errors import ServingError
from keras_vllm.layers.common import lora_slots
from keras_vllm.load import adapter_checks

logger = logging.getLogger("keras_vllm")


def _unlink(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def _slot_dtype(layer):
    """The numpy dtype of a layer's slots (the served dtype)."""
    return jnp.dtype(layer.lora_slots_a.dtype)


class _Adapter:
    """One adapter's factors in host memory (None for a warm-up dummy)."""

    def __init__(self, request, factors=None):
        self.request = request
        self.factors = factors  # [(layer, a, b, scale, bias change or None)]


class KerasLoraManager:
    """Adapters in stacked slots of the served model's projections.

    Args:
        model: the served `KerasVllmForCausalLM` (slots installed).
        lora_config: vLLM's `LoRAConfig`.
    """

    def __init__(self, model, lora_config):
        self.model = model
        self.max_loras = int(lora_config.max_loras)
        self.max_rank = int(lora_config.max_lora_rank)
        self.capacity = int(lora_config.max_cpu_loras or self.max_loras)
        # Set by `lora_runner` on the first step: its state is refreshed
        # after slots are written.
        self.runner = None
        self._adapters = collections.OrderedDict()  # int id -> _Adapter
        self._pinned = set()
        self._slot_of = {}  # int id -> slot
        self._in_slot = [None] * (self.max_loras + 1)  # slot -> int id
        self.token_slots = None
        # Evicted adapters: int id -> (request, private spill file,
        # [(layer, dtype)]).
        self._spilled = {}
        self._spill_dir = None

    # -- vLLM's WorkerLoRAManager interface ------------------------------
    def add_adapter(self, lora_request):
        """Reads an adapter artifact (`lora_request.lora_path`); False if it
        is held already (unless `load_inplace`: then it is read again and
        replaces the held one)."""
        lora_id = lora_request.lora_int_id
        inplace = bool(getattr(lora_request, "load_inplace", False))
        if lora_id in self._spilled and not inplace:
            return False
        if lora_id in self._adapters and not inplace:
            self._adapters.move_to_end(lora_id)
            return False
        factors = self._read(lora_request)  # refused before anything changes
        if lora_id in self._adapters or lora_id in self._spilled:
            self.remove_adapter(lora_id)
        self._make_room()
        self._adapters[lora_id] = _Adapter(lora_request, factors)
        logger.info("keras-vllm: loaded LoRA adapter '%s' (id %d) from %s",
                    lora_request.lora_name, lora_id, lora_request.lora_path)
        return True

    def remove_adapter(self, adapter_id):
        spilled = self._spilled.pop(adapter_id, None)
        if spilled is not None:
            _unlink(spilled[1])
        if self._adapters.pop(adapter_id, None) is None:
            return spilled is not None
        self._pinned.discard(adapter_id)
        slot = self._slot_of.pop(adapter_id, None)
        if slot is not None:
            self._in_slot[slot] = None
        return True

    def remove_all_adapters(self):
        for adapter_id in list(self._adapters):
            self.remove_adapter(adapter_id)

    def pin_adapter(self, adapter_id):
        if adapter_id not in self._adapters:
            raise ValueError(f"LoRA adapter {adapter_id} is not loaded.")
        self._pinned.add(adapter_id)
        return True

    def list_adapters(self):
        return set(self._adapters) | set(self._spilled)

    def held_requests(self):
        """The `LoRARequest`s of the adapters held (in memory or spilled),
        warm-up dummies left out."""
        held = [a.request for a in self._adapters.values()
                if a.factors is not None]
        return held + [spilled[0] for spilled in self._spilled.values()]

    def check_new_base(self, base):
        """Refuses a new base that an adapter held does not fit (a reload
        to it would serve the adapter on weights it was not trained on).

        Args:
            base: the new base's opened `keras_vllm.format.Artifact`.

        Raises:
            ServingError: naming every such adapter and the fix.
        """
        from keras_vllm.errors import KerasVllmError

        misfits = []
        for request in self.held_requests():
            try:
                adapter_checks.check_adapter(
                    adapter_checks.open_adapter(request.lora_path), base,
                    self.max_rank,
                )
            except KerasVllmError:
                misfits.append(request.lora_name)
        if misfits:
            raise ServingError(
                f"The loaded LoRA adapters {sorted(misfits)} do not fit the "
                f"new base '{base.path}' (they were exported against the served "
                "one). Unload them first (`/v1/unload_lora_adapter`, "
                "`engine.remove_adapter`), or export them against the new "
                "base."
            )

    def set_active_adapters(self, requests, mapping):
        """Puts the step's adapters in slots and maps its tokens to them."""
        needed = {i for i in mapping.index_mapping if i > 0}
        if len(needed) > self.max_loras:
            raise ServingError(
                f"A step uses {len(needed)} LoRA adapters, more than "
                f"max_loras={self.max_loras} slots."
            )
        for request in requests:
            lora_id = request.lora_int_id
            if lora_id not in needed or lora_id in self._adapters:
                continue
            spilled = self._spilled.pop(lora_id, None)
            if spilled is None:
                # Never added (vLLM adds every adapter before its requests
                # run): read now; nothing else can read it in time.
                factors = self._read(request)
            else:
                # Evicted: its checked factors, from the private spill.
                factors = self._unspill(spilled)
            self._make_room(keep=needed)
            self._adapters[lora_id] = _Adapter(request, factors)
        wrote = False
        for lora_id in sorted(needed):
            if lora_id not in self._adapters:
                raise ServingError(f"LoRA adapter {lora_id} is not loaded.")
            if lora_id not in self._slot_of:
                wrote |= self._place(lora_id, needed)
            self._adapters.move_to_end(lora_id)
        if wrote and self.runner is not None:
            self.runner.refresh_state_leaves()
        slots = np.array(
            [self._slot_of[i] if i > 0 else 0 for i in mapping.index_mapping],
            dtype=np.int32,
        )
        self.token_slots = self._on_mesh(slots)

    @contextlib.contextmanager
    def dummy_lora_cache(self):
        yield

    def add_dummy_lora(self, lora_request, rank):
        """A warm-up adapter: it takes a slot but writes nothing (the
        compiled shapes do not depend on a slot's values)."""
        self._adapters[lora_request.lora_int_id] = _Adapter(lora_request)
        return True

    def get_dummy_lora_warmup_rank(self, rank):
        return rank

    # -- slots -------------------------------------------------------------
    def _make_room(self, keep=()):
        """Evicts least recently used adapters (not pinned, not in `keep`)
        until one more fits in host memory."""
        while len(self._adapters) >= self.capacity:
            victim = next(
                (i for i in self._adapters
                 if i not in self._pinned and i not in keep), None
            )
            if victim is None:
                raise ServingError(
                    f"All {self.capacity} LoRA adapters held (max_cpu_loras) "
                    "are pinned; unpin or remove one first."
                )
            self._spill(victim)

    def _place(self, lora_id, needed):
        """Gives `lora_id` a slot (a free one, else one no token of this
        step needs) and writes its factors there; True if it wrote."""
        free = [s for s in range(1, self.max_loras + 1)
                if self._in_slot[s] is None]
        if not free:
            free = [s for s in range(1, self.max_loras + 1)
                    if self._in_slot[s] not in needed]
        slot = free[0]
        previous = self._in_slot[slot]
        if previous is not None:
            self._slot_of.pop(previous, None)
        self._in_slot[slot], self._slot_of[lora_id] = lora_id, slot
        factors = self._adapters[lora_id].factors
        if factors is None:
            return False
        self._write(slot, factors)
        return True

    def _write(self, slot, factors):
        from tpu_inference.layers.common.utils import general_device_put

        def put(variable, value):
            current = variable.value
            variable.assign(general_device_put(
                current.at[slot].set(value), current.sharding
            ))

        by_layer = {id(layer): rest for layer, *rest in factors}
        for layer in lora_slots.slotted_layers(self.model.backbone):
            # Layers the adapter does not target get zeros in its slot.
            a, b, scale, bias = by_layer.get(
                id(layer), (None, None, 0.0, None)
            )
            padded_a = np.zeros(layer.lora_slots_a.shape[1:], _slot_dtype(layer))
            padded_b = np.zeros(layer.lora_slots_b.shape[1:], _slot_dtype(layer))
            if a is not None:
                # Rank r of max_rank: A's first r columns, B's first r rows.
                padded_a[..., : a.shape[-1]] = a
                padded_b[: b.shape[0]] = b
            put(layer.lora_slots_a, padded_a)
            put(layer.lora_slots_b, padded_b)
            put(layer.lora_slots_scale, scale)
            if hasattr(layer, "lora_slots_bias"):
                put(layer.lora_slots_bias, 0.0 if bias is None else bias)

    def _on_mesh(self, slots):
        import jax
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec

        mesh = self.model.mesh
        if mesh is None:
            return jax.numpy.asarray(slots)
        return jax.device_put(slots, NamedSharding(mesh, PartitionSpec()))

    def _spill(self, lora_id):
        """Moves an adapter's checked factors out of host memory into a
        private file (its slot is freed as by `remove_adapter`)."""
        adapter = self._adapters[lora_id]
        self.remove_adapter(lora_id)
        if adapter.factors is None:  # a warm-up dummy: nothing to keep
            return
        if self._spill_dir is None:
            self._spill_dir = tempfile.mkdtemp(prefix="keras_vllm_lora_")
        path = os.path.join(self._spill_dir, f"{lora_id}.npz")
        arrays = {}
        for i, (_, a, b, scale, bias) in enumerate(adapter.factors):
            # float32 holds bfloat16/float16 exactly; cast back on return.
            arrays[f"a{i}"] = np.asarray(a, np.float32)
            arrays[f"b{i}"] = np.asarray(b, np.float32)
            arrays[f"s{i}"] = np.asarray(scale, np.float32)
            if bias is not None:
                arrays[f"bias{i}"] = np.asarray(bias, np.float32)
        with open(path, "wb") as f:
            np.savez(f, **arrays)
        layers = [(layer, a.dtype) for layer, a, *_ in adapter.factors]
        self._spilled[lora_id] = (adapter.request, path, layers)

    def _unspill(self, spilled):
        _, path, layers = spilled
        with np.load(path, allow_pickle=False) as stored:
            factors = [
                (layer, stored[f"a{i}"].astype(dtype),
                 stored[f"b{i}"].astype(dtype), float(stored[f"s{i}"]),
                 stored[f"bias{i}"].astype(dtype)
                 if f"bias{i}" in stored else None)
                for i, (layer, dtype) in enumerate(layers)
            ]
        _unlink(path)
        return factors

    # -- reading an adapter artifact ----------------------------------------
    def _read(self, request):
        from keras_vllm.load import adapter
        from keras_vllm.load import rebuild

        path = request.lora_path
        if not os.path.isdir(path):
            from vllm.exceptions import LoRAAdapterNotFoundError

            # vLLM's own error: its server answers it with a 404 (any
            # other error is a 500).
            raise LoRAAdapterNotFoundError(request.lora_name, path)
        opened = adapter_checks.open_adapter(path)
        manifest = opened.manifest
        model = self.model
        names = tuple(model.backbone.default_lora_layer_names())
        adapter_checks.check_adapter(
            opened, model.artifact, self.max_rank, names
        )
        targets = adapter.target_layers(model.backbone, manifest)
        dtype = jnp.dtype(model.dtype_name)
        # The changed variables (the targets' biases, `check_adapter`) and
        # the factors: one restore of the whole tree (orbax refuses a part).
        variables, specs = rebuild.matched_specs(
            model.backbone, manifest, model.dtype_name
        )
        factor_specs = fmt.adapter.factor_specs(manifest)
        restored = checkpoint.restore_weights(
            opened.file(fmt.WEIGHTS_DIR), {**specs, **factor_specs}
        )
        bias_deltas = {}
        for var_path, variable in variables.items():
            # The change against the served base, applied per token.
            base = np.asarray(variable.value, np.float32)
            bias_deltas[var_path.rsplit("/", 1)[0]] = (
                restored[var_path].astype(np.float32) - base
            ).astype(dtype)
        factors = []
        for layer_path, (layer, _) in sorted(targets.items()):
            if not getattr(layer, "_has_lora_slots", False):
                raise ServingError(
                    f"The adapter '{path}' targets '{layer_path}', where the "
                    "engine holds no adapter slots."
                )
            target = manifest["adapter"]["targets"][layer_path]
            a_path, b_path = fmt.adapter.factor_paths(layer_path)
            bias = bias_deltas.get(layer_path)
            if bias is not None and not hasattr(layer, "lora_slots_bias"):
                raise ServingError(
                    f"The adapter '{path}' changes the bias of '{layer_path}', "
                    "which has no bias in the served base."
                )
            factors.append((
                layer,
                restored[a_path].astype(dtype),
                restored[b_path].astype(dtype),
                target["alpha"] / target["rank"],
                bias,
            ))
        return factors
