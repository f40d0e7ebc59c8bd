"""Human-readable summaries of an artifact (used by `keras-vllm inspect`)."""

import os

from keras_vllm import format as fmt


def _size(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def weights_line(manifest):
    """Which weights an artifact stores, e.g. "delta: 3 of 36 variables,
    1.2 KiB" (printed by `keras-vllm export` and `inspect`)."""
    weights = manifest["weights"]
    return (
        f"{weights['mode']}: {len(weights['variables'])} of "
        f"{weights.get('total_variables', '?')} variables, "
        f"{_size(weights.get('bytes', 0))}"
    )


def quantization_line(manifest):
    """E.g. "int8: 15 layers", or "no" for a float model."""
    modes = fmt.quantization.modes(manifest)
    if not modes:
        return "no"
    return ", ".join(
        f"{mode}: {count} layer{'s' if count > 1 else ''}"
        for mode, count in sorted(modes.items())
    )


def summary(artifact):
    """Returns a multi-line summary of an opened, validated artifact."""
    path, manifest = artifact.path, artifact.manifest
    preset = manifest.get("preset")
    files = manifest["files"]
    family = manifest["backbone"]["class_name"].removesuffix("Backbone")
    lines = [
        f"artifact        {os.path.abspath(path)}",
        f"format          {fmt.FORMAT_NAME} "
        f"{'.'.join(map(str, manifest['format_version']))}",
        f"family          {family} ({manifest['causal_lm']['class_name']})",
        f"parameters      {manifest.get('parameter_count', 0):,}",
        f"dtype           {manifest['dtype']}",
        f"quantized       {quantization_line(manifest)}",
        f"preset          {preset['handle'] if preset else '(none)'}",
        f"weights         {weights_line(manifest)}",
        f"tokenizer       {manifest['tokenizer']['class_name']}",
        f"sampler         {manifest['sampler']['class_name']} "
        f"{manifest['sampler']['config']}",
        f"stop tokens     {manifest['stop_token_ids']}",
        f"max length      {manifest['max_sequence_length']}",
        f"servable        {'yes' if manifest.get('servable', True) else 'no'}",
        "written by      "
        + ", ".join(f"{k} {v}" for k, v in sorted(manifest["written_by"].items())),
        "signature       "
        + (
            f"{fmt.SIGNATURE_FILE} (check it with --public-key)"
            if os.path.isfile(os.path.join(path, fmt.SIGNATURE_FILE))
            else "none (keras-vllm sign)"
        ),
        f"files           {len(files)} files, "
        f"{_size(sum(f['bytes'] for f in files.values()))}",
    ]
    for rel in sorted(files):
        if not rel.startswith(fmt.WEIGHTS_DIR + "/"):
            lines.append(f"  {rel:<40} {_size(files[rel]['bytes'])}")
    weight_files = [r for r in files if r.startswith(fmt.WEIGHTS_DIR + "/")]
    if weight_files:
        total = sum(files[r]["bytes"] for r in weight_files)
        lines.append(
            f"  {fmt.WEIGHTS_DIR + '/':<40} {_size(total)} "
            f"({len(weight_files)} orbax files)"
        )
    return "\n".join(lines)


def kv_cache_lines(artifact):
    """KV cache bytes per token (one device, stored dtype) per kind of
    attention layer, counting a cache that several layers share once (the
    saving is printed beside the total)."""
    from keras_vllm.serve.worker import capacity

    manifest = artifact.manifest
    if not manifest.get("servable", True):
        return []
    config = artifact.read_json(fmt.CONFIG_FILE)
    if int(config["num_hidden_layers"]) > _MAX_TABLE_LAYERS:
        return []
    rows = capacity.kv_by_kind(config, manifest["dtype"])
    lines = [
        "KV cache        kind                layers  caches  "
        "KV heads x head size  per token"
    ]
    for row in rows:
        shape = f"{row['kv_heads']} x {row['head_dim']}"
        if row["laid_out"] != row["head_dim"]:
            shape += f" (as {row['laid_out']})"
        lines.append(
            f"                {row['kind']:<18}  {row['layers']:>6}  "
            f"{row['caches']:>6}  {shape:<20}  {_size(row['bytes']):>9}"
        )
    total = sum(row["bytes"] for row in rows)
    unshared = sum(row["unshared_bytes"] for row in rows)
    line = (
        f"                {'all':<18}  "
        f"{sum(row['layers'] for row in rows):>6}  "
        f"{sum(row['caches'] for row in rows):>6}  {'':<20}  {_size(total):>9}"
    )
    if unshared != total:
        line += (
            f" (shared caches save {_size(unshared - total)}: "
            f"{_size(unshared)} with one cache per layer)"
        )
    lines.append(line)
    state = capacity.state_bytes_per_sequence(config)
    if state:
        # Not per token: a fixed size per running sequence (format 1.10).
        lines.append(
            f"recurrent state {len(config['recurrent_state_layers'])} "
            f"layers, {_size(state)} per sequence (one slot per running "
            "sequence, whatever its length; num_speculative_tokens + 1 "
            "slots when speculating)"
        )
    return lines


# Real models have at most a few hundred layers.
_MAX_TABLE_LAYERS = 512


def tensor_parallel_lines(artifact):
    """Per-device weight and KV cache bytes at TP = 1, 2, 4, 8 (stored
    dtype), from the opened artifact's backbone built with shapes only."""
    from keras_vllm.serve.worker import capacity
    from keras_vllm.load import tensor_parallel

    manifest = artifact.manifest
    if not manifest.get("servable", True):
        return []
    config = artifact.read_json(fmt.CONFIG_FILE)
    layers = int(config["num_hidden_layers"])
    if layers > _MAX_TABLE_LAYERS:
        # The table builds the backbone (shapes only), in time linear in its
        # layers: bounded, so that a hostile config cannot stall inspect.
        return [
            f"per device      (not computed: {layers} layers, more than "
            f"{_MAX_TABLE_LAYERS})"
        ]
    rows = capacity.per_device(
        capacity.abstract_backbone(manifest), config, manifest["dtype"]
    )
    lines = [
        "per device      TP  weights (stored)  KV cache per token"
    ]
    for size, weights, kv in rows:
        if weights is None:
            reason = tensor_parallel.refusal(config, size)[0]
            lines.append(f"                {size:>2}  (refused: {reason})")
        else:
            lines.append(
                f"                {size:>2}  {_size(weights):>18}  {_size(kv):>18}"
            )
    return lines

