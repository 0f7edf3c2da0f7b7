"""Checks of the user's inputs on disk (script, data files), before planning and before any process starts.

A file-backed data set is read once here: errors in it are reported like config errors, and the sizes the model
needs (continuous/categorical fields, vocabulary per field, training rows) are written into the config, so that
the plan (pure) can size tables and epochs and every rank builds the same model.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, open_dict

from launcher.errors import ConfigError


def check_inputs(cfg: DictConfig) -> list[str]:
    """Raise ConfigError naming each missing or unreadable input and how to fix it; return lines to show."""
    problems, lines = [], []
    if cfg.script:
        path = Path(cfg.script)
        if not path.is_file():
            problems.append(
                f"script={cfg.script}: no such file (relative paths start at {Path.cwd()}). "
                f"Give the path of a Python script, e.g. script=path/to/train.py."
            )
    if str(cfg.data.get("_target_", "")).endswith("tabular.TabularCTR"):
        from launcher.recipes.wide_deep.tabular import TabularError, prepare

        d = cfg.data
        try:
            p = prepare(d.path, d.label, str(d.positive), str(d.negative), list(d.categorical), list(d.continuous),
                        list(d.drop), d.test_fraction, d.max_vocab, [list(c) for c in d.crosses], d.seed)
        except TabularError as e:
            problems += e.problems
        else:
            with open_dict(cfg):
                cfg.model.num_dense = len(p.continuous)
                cfg.model.num_sparse = len(p.categorical)
                cfg.model.field_sizes = p.field_sizes
                cfg.data.train_rows = len(p.train[2])
            positives = float(p.train[2].mean())
            lines.append(
                f"data: {d.path}: {len(p.train[2]):,} train + {len(p.test[2]):,} test rows, {positives:.1%} positive; "
                f"continuous {p.continuous or '-'}; categorical {dict(zip(p.categorical, p.field_sizes)) or '-'} "
                f"(rows incl. the out-of-vocabulary row)"
            )
    if problems:
        raise ConfigError(problems)
    return lines
