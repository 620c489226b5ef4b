"""The one way a config is finished: every tool calls `finalize_cfg`, every worker `receive_cfg`.

`finalize_cfg` merges the YAML file and the KEY VALUE overrides (aliases and Detectron's renamed keys
included), reconciles NUM_GPUS with a launcher's world size, checks every numeric key's domain
(core/config_domains.py), asks the model type whether it builds these settings, registers
DATASET_CATALOG, and for training fills the keys the model type derives, rescales the schedule to
the global batch and picks the precision this machine can train in; then it freezes the cfg.
Workers get the frozen result: `receive_cfg` makes it theirs and registers the same catalog, so
every process resolves the same dataset names. A tool or worker then builds its model type from the
finished cfg once (model_builder.build_model_type) and hands it to the engines.
"""
import logging

from detectron.core.config import (adopt_cfg, assert_and_infer_cfg, cfg, check_domains, images_per_iter,
                                   merge_cfg_from_command_line, scale_schedule_to_global_batch, typed_keys)
from detectron.datasets import dataset_catalog

logger = logging.getLogger(__name__)


def finalize_cfg(cfg_file, opts, training=False):
    """Finish the global cfg of a tool (cfg_file: a YAML path or None; opts: KEY VALUE overrides) and
    freeze it. Returns the lines in which the model type says what it derived for training, keys the
    user typed kept (the schedule's rescaling and a precision change are logged where they happen)."""
    merge_cfg_from_command_line(cfg_file, opts)
    check_domains()  # before the model type or a derivation computes with a value outside its key's domain
    # Imported here: the model code brings torch (seconds to import), and a command line's own mistakes
    # (keys, values, files) are reported before it.
    from detectron.modeling import model_builder
    model_type = model_builder.build_model_type(cfg)  # bound to the cfg being finished
    model_type.check()  # once, before any process starts
    dataset_catalog.register_catalog_file(cfg.DATASET_CATALOG)
    derived = []
    if training:
        derived = model_type.derive_training_cfg(typed_keys())
        scale_schedule_to_global_batch(images_per_iter())
        _train_in_a_precision_this_cpu_runs()
    assert_and_infer_cfg()
    return derived


def receive_cfg(finished_cfg):
    """A worker's start: the finished cfg its launcher sent becomes the global one (frozen)."""
    adopt_cfg(finished_cfg)
    dataset_catalog.register_catalog_file(cfg.DATASET_CATALOG)


def _train_in_a_precision_this_cpu_runs():
    """bfloat16 autocast on a CPU without bfloat16 instructions (neither AVX512-BF16 nor AMX) trains
    in float32 instead, said once: there oneDNN's fallback runs many times slower than float32
    (BENCHMARKS.md, "CPU demos"), and autocast is asked for speed."""
    import torch  # loaded by now, with the model code
    amp = cfg.SOLVER.AMP
    bfloat16 = amp.ENABLED and amp.DTYPE in ('bfloat16', 'bf16')
    if not bfloat16 or torch.cuda.is_available() or not cpu_bfloat16_is_emulated():
        return
    logger.warning('SOLVER.AMP.ENABLED with bfloat16, but this CPU has no bfloat16 instructions (AVX512-BF16 '
                   'or AMX), where autocast runs many times slower than float32: training in float32 '
                   '(SOLVER.AMP.ENABLED False)')
    amp.ENABLED = False


def cpu_bfloat16_is_emulated():
    """Whether this CPU lacks the bfloat16 instructions (AVX512-BF16, AMX) of oneDNN's fast kernels."""
    import torch  # loaded by now, with the model code
    probes = [getattr(torch.cpu, name, None) for name in ('_is_avx512_bf16_supported', '_is_amx_tile_supported')]
    return all(probe is not None and not probe() for probe in probes)
