"""What a sweep runs (specs, presets, shards) and how it runs (windows, incremental raw file, resume).

A sweep is a list of *groups*; each group is a product shapes × dtypes × layouts × ops × backends. A spec
file is TOML (`.toml`) or JSON (`.json`) with the same structure (see docs/sweep.md):

    name = "my-sweep"
    [[group]]
    backends = ["torch", "torch-lt"]
    ops = ["mm"]
    dtypes = ["bf16", "fp16"]
    layouts = ["NT"]
    m = {pow2 = [1, 16384]}          # or a list, or {pow2 = [64, 8192], neighbours = [1, 8, 16]}
    n = [4096, 14336]
    k = [4096]
    # or: shapes = [[16, 4096, 4096], [128, 4096, 4096, 8]]   (m, n, k[, batch])

A group of grouped GEMMs (ops grouped_mm, scaled_grouped_mm) adds `groups` (an int or a list) and `group_sizes`
("uniform", "batched", {zipf = S}, {seed = N, top_k = K}, a list of row counts, or a list of these); its
shapes' m is the rows of all groups together (see `cases`):

    [[group]]
    ops = ["grouped_mm"]
    dtypes = ["bf16"]
    layouts = ["NT"]
    shapes = [[16384, 1536, 2048]]
    groups = 128
    group_sizes = ["uniform", {seed = 0, top_k = 8}, {zipf = 1.0}]

Combinations a product makes that cannot run (fp8 outside scaled_mm, bf16 on cupy, ...) are left out of the
plan and counted by reason, so the plan says what it skipped and why; nothing fails mid-sweep for that.

The package's modules, in the order a sweep uses them: `spec` (spec -> the plan's GEMMs), `presets` (the
built-in specs; `plan`), `slices` (this process's slice), `runner` (windows -> raw file -> dataset), `claims`
(`--devices`: blocks claimed by workers), `parts` (raw records -> Parquet), `merging` (slices -> one
dataset), `numpy_executor` (the CPU executor of the `numpy` backend).
"""
from __future__ import annotations

from cublaslt_probe.sweep.claims import (
                                       BLOCK_WINDOWS,
                                       CLAIMS_PER_WORKER,
                                       claim,
                                       claim_order,
                                       claimed_groups,
                                       fine_slices,
                                       run_claimed,
                                       unclaimed,
                                       wait_for_workers,
)
from cublaslt_probe.sweep.merging import Merged, merge
from cublaslt_probe.sweep.numpy_executor import NumpyExecutor
from cublaslt_probe.sweep.parts import (
                                       BATCH_ROWS,
                                       BUILDER_ROWS,
                                       BUILDERS_MAX,
                                       CHUNK_ROWS,
                                       HOST_PROCS_VARS,
                                       PART_PATTERNS,
                                       KeyIndex,
                                       Part,
                                       RowBuilders,
                                       builder_jobs,
                                       find_parts,
                                       raw_env,
                                       raw_keys,
                                       write_dataset,
)
from cublaslt_probe.sweep.presets import (
                                       LLM_MODELS,
                                       MOE_MODELS,
                                       MOE_TOKENS,
                                       TOKENS,
                                       llm_weights,
                                       moe_groups,
                                       plan,
                                       preset,
)
from cublaslt_probe.sweep.runner import (
                                       FSYNC_S,
                                       Progress,
                                       build_dataset,
                                       out_base,
                                       part_path,
                                       raw_path,
                                       run,
                                       run_meta,
                                       run_raw,
                                       run_raw_parts,
)
from cublaslt_probe.sweep.slices import (
                                       SCHEDULER_VARS,
                                       SLOT_VARS,
                                       WHOLE,
                                       Slice,
                                       cpu_slot,
                                       local_rank_device,
                                       parse_shard,
                                       shard,
                                       shard_from_env,
)
from cublaslt_probe.sweep.spec import (
                                       GROUPED,
                                       NAMES,
                                       SIZES,
                                       Cases,
                                       Plan,
                                       expand_axis,
                                       load_spec,
                                       numpy_invalid,
                                       plan_from_spec,
)
from cublaslt_probe.vocab import PRESETS

__all__ = ['PRESETS', 'Cases', 'expand_axis', 'GROUPED', 'load_spec', 'NAMES', 'numpy_invalid', 'Plan',
           'plan_from_spec',
           'SIZES', 'LLM_MODELS', 'llm_weights', 'moe_groups', 'MOE_MODELS', 'MOE_TOKENS', 'plan', 'preset',
           'TOKENS', 'cpu_slot', 'local_rank_device', 'parse_shard', 'SCHEDULER_VARS', 'shard', 'shard_from_env',
           'Slice', 'SLOT_VARS', 'WHOLE', 'build_dataset', 'FSYNC_S', 'out_base', 'part_path', 'Progress',
           'raw_path', 'run', 'run_meta', 'run_raw', 'run_raw_parts', 'BLOCK_WINDOWS', 'claim', 'claim_order',
           'claimed_groups', 'CLAIMS_PER_WORKER', 'fine_slices', 'run_claimed', 'unclaimed', 'wait_for_workers',
           'BATCH_ROWS', 'builder_jobs', 'BUILDER_ROWS', 'BUILDERS_MAX', 'CHUNK_ROWS', 'find_parts',
           'HOST_PROCS_VARS', 'KeyIndex', 'Part', 'PART_PATTERNS', 'raw_env', 'raw_keys', 'RowBuilders',
           'write_dataset', 'merge', 'Merged', 'NumpyExecutor']
