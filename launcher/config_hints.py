"""What to say of a command-line key the config does not have: another tool's name for one of ours (SYNONYMS), a
close spelling, its siblings, or a mapping of names of your choosing (placement.modules, parallel.stages) that Hydra
adds to only with a leading +."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf

from launcher.errors import did_you_mean

SYNONYMS = {
    "parallel.tensor_parallel": "parallel.tp={}", "parallel.tensor_parallel_size": "parallel.tp={}",
    "parallel.tp_size": "parallel.tp={}", "parallel.pipeline_parallel": "parallel.pipeline_stages={}",
    "parallel.pipeline_parallel_size": "parallel.pipeline_stages={}", "parallel.pp": "parallel.pipeline_stages={}",
    "parallel.data_parallel_size": "parallel.dp={}", "parallel.zero_stage": "zero.stage={}",
    "placement.offload_optimizer": "optimizer.target=CPU", "zero.offload_optimizer": "optimizer.target=CPU",
    "placement.offload_param": "placement.offload_params={}", "zero.offload_params": "placement.offload_params={}",
    "trainer.max_steps": "trainer.steps={}", "trainer.lr": "optimizer.lr={}",
    "trainer.learning_rate": "optimizer.lr={}",
    "trainer.gradient_accumulation_steps": "batch.grad_accum={}", "trainer.batch_size": "batch.global_size={}",
    "trainer.precision": "precision={}", "trainer.gradient_clipping": "trainer.grad_clip={}",
    "trainer.max_grad_norm": "trainer.grad_clip={}", "batch.micro_batch_size": "batch.micro_size={}",
}
"""Keys other tools name (Megatron's and DeepSpeed's sizes, HF Trainer's arguments) that are not ours, and the form
of ours that does the same ({} takes the value given): a did-you-mean by spelling sent tensor_parallel to
data_parallel and offload_optimizer to offload_params, each refused next."""


OFF = ("false", "0", "no", "off", "none", "null")
"""Values that switch an on/off key off (placement.offload_optimizer=false)."""


def synonym_hint(key: str, value: str) -> str:
    """' Here that is <ours>: write <ours>=<value>.' for a key of SYNONYMS, or one spelt close to it ('' for any
    other)."""
    close = difflib.get_close_matches(key, list(SYNONYMS), n=1, cutoff=0.9)
    form = SYNONYMS[close[0]] if close else None
    if form and "{}" not in form and str(value).lower() in OFF:  # an on/off synonym set off: our key's default
        return f" Here that is {form.split('=')[0]}, off by default: leave it out."
    return f" Here that is {form.split('=')[0]}: write {form.format(value)}." if form else ""


def mapping_without_plus(base: DictConfig, key: str, value: Any, line: str, open_sections: Sequence[str]) -> str | None:
    """The problem of ``key=value`` without the + Hydra needs to add a name to a mapping of names of your choosing (a
    dict-typed key of the schema: placement.modules, parallel.stages): the mapping given whole with a name it has not,
    or a name it has not; None for any other line (a name it has is set as any key; ``open_sections``: the recipe's
    own sections, said elsewhere)."""
    if line.startswith(("+", "~")) or key.split(".")[0] in (*open_sections, "tables"):  # (tables: its own path forms)
        return None
    parent_key, _, leaf = key.rpartition(".")
    node = OmegaConf.select(base, key, default=None)
    parent = OmegaConf.select(base, parent_key, default=None) if parent_key else None
    if _names(node) and isinstance(value, dict) and {str(k) for k in value} - set(node.keys()):
        at = key
    elif (_names(parent) and leaf not in parent.keys()
          and not difflib.get_close_matches(leaf, parent.keys(), cutoff=0.8)):  # (a typo: unknown_key's did-you-mean)
        at = parent_key
    else:
        return None
    return (f"{line}: {at} maps names of your choosing to values, and Hydra adds a name to such a mapping only with a "
            f"leading +: write '+{line}'.")


def _names(node: Any) -> bool:
    """Whether ``node`` is a mapping of names of your choosing (dict-typed in the schema), not a section of keys."""
    return isinstance(node, DictConfig) and OmegaConf.get_type(node) is dict


def unknown_key(key: str, value: str, candidates: Sequence[str], what: str) -> str:
    """The problem of ``key=value`` where the config has no ``key`` (``what``: "option of" a config group, or a key),
    with the key meant: another tool's name for one of ours (SYNONYMS), a close spelling among its siblings, or the
    siblings listed."""
    if what == "option of":
        hint = did_you_mean(value, candidates, f"{key}=")
        return f"{key}={value}: no such {key}.{hint} Available: {', '.join(candidates)}."
    parent, _, leaf = key.rpartition(".")
    same_depth = [c for c in candidates if c.count(".") == key.count(".")]
    # The leaf among its siblings' (a shared "model." would make model.nan_at look like model._target_), else a
    # typo in the section's name (trainr.steps) among the other sections' keys, whole.
    close = [f"{parent}.{c}" if parent else c for c in difflib.get_close_matches(
        leaf, [c.rpartition(".")[2] for c in same_depth if c.rpartition(".")[0] == parent], n=1, cutoff=0.6)]
    close = close or difflib.get_close_matches(key, [c for c in same_depth if c.rpartition(".")[0] != parent], n=1,
                                               cutoff=0.8)
    hint = synonym_hint(key, value) or (f" Did you mean {close[0]}? Write {close[0]}={value}." if close else "")
    siblings = [c.rpartition(".")[2] for c in candidates if c.rpartition(".")[0] == parent]
    known = f" Keys under {parent or 'the root'}: {', '.join(siblings)}." if siblings and not close else ""
    return f"{key}: no such key (value {value}).{hint}{known}"
