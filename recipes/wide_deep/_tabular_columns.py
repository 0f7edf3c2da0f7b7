"""What the columns of a data=tabular file are, before any is read for training: the label's positive value
(data.positive, or 1 / true of a 0/1 or true/false column) and the columns named as ids (categorical though their
values are integers); the continuous values no standardisation survives (inf, -inf, beyond float32); and the error
every reader raises (recipes/wide_deep/tabular.py re-exports it)."""

from __future__ import annotations

import re

import numpy as np


class TabularError(ValueError):
    """Problems with the user's file or columns; each entry names the key, the value and a fix."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


ID_NAME = re.compile(r"(?i:(^|_)id)$|[a-z0-9](Id|ID)$")
"""A column named as an identifier: id, user_id, movieId, itemID (not paid, valid, grid)."""


def column_conflicts(label: str, categorical, continuous, drop, crosses) -> list[str]:
    """A column the data.* keys name for two things: the label also as a feature or dropped, a column both
    categorical and continuous, a dropped column also used (a reader settled each silently: continuous won over
    categorical, the label stayed, drop won over the others)."""
    crossed = {c for pair in crosses for c in pair}
    uses = (("data.categorical", set(categorical)), ("data.continuous", set(continuous)), ("data.crosses", crossed))
    problems = [f"data.label={label} is also in {key}: the label is what the model predicts, never one of its "
                f"features. Remove it from {key}." for key, cols in uses if label in cols]
    if label in drop:
        problems.append(f"data.label={label} is also in data.drop: the label column is read as the label whatever "
                        f"data.drop says. Remove it from data.drop.")
    both = sorted((set(categorical) & set(continuous)) - {label})
    if both:
        problems.append(f"data.categorical and data.continuous both name {', '.join(both)}: a column is one or the "
                        f"other (ids in a vocabulary, or a standardised number). Remove it from one of them.")
    for key, cols in uses:
        dropped = sorted((cols & set(drop)) - {label})
        if dropped:
            problems.append(f"data.drop and {key} both name {', '.join(dropped)}: a dropped column is not read. "
                            f"Remove it from one of them.")
    return problems


def id_columns(names, label, categorical, continuous, drop) -> list[str]:
    """Columns named as identifiers (``ID_NAME``) that no data.* key types or drops: categorical, as a user id or a
    movie id is, though its values are integers (MovieLens' user_id and movie_id read as numbers trained to AUC 0.72
    instead of 0.78)."""
    said = {label, *categorical, *continuous, *drop}
    return [h for h in names if h not in said and ID_NAME.search(h)]


TRUE_LABELS = ("1", "true", "1.0")
"""A 0/1 or boolean label's positive value (any case): no data.positive needed."""
BINARY_LABELS = ({"0", "1"}, {"false", "true"}, {"0.0", "1.0"})


def is_positive(text: str, positive: str) -> bool:
    """Whether a label value is the positive one: data.positive, or (empty) 1 / true / 1.0."""
    return text == positive if positive else text.strip().lower() in TRUE_LABELS


def _check_labels(label: str, positive: str, negative: str, values: list[str]) -> str:
    """The positive label value: data.positive, or for a 0/1 or true/false column (data.positive empty) its 1 / true.
    TabularError unless the label column's distinct values (sorted) are that and one negative value."""
    nested = [v for v in values if v[:1] in ("[", "{") and v[-1:] in ("]", "}")]
    if nested:  # a list or struct column (Parquet): no data.positive can name such a value
        raise TabularError([f"data.label={label}: column {label!r} holds lists or mappings ({nested[0]}), not one "
                            f"value a row. Set data.label to a column of one 0/1, true/false or named value a row."])
    blank = any(not v.strip() for v in values)  # a missing label: no data.positive or data.negative can name it
    if blank and (not positive or negative or len(values) > 2):  # (data.positive alone: the rest are negatives)
        raise TabularError([f"data.label={label}: some rows of column {label!r} have no label (blank or null; its "
                            f"other values: {', '.join(v for v in values[:10] if v.strip())}), and no data.positive "
                            f"or data.negative can name that. Drop those rows from the file (pandas: "
                            f"df.dropna(subset=[{label!r}])), or set data.positive alone if every row without it is a "
                            f"negative one."])
    if not positive:
        lower = {v.strip().lower() for v in values}
        if len(values) != 2 or not any(lower == pair for pair in BINARY_LABELS):
            raise TabularError([f"data.label={label}: data.positive is not set and column {label!r} is not a 0/1 or "
                                f"true/false label (its values: {', '.join(values[:10])}). Set data.positive to the "
                                f"clicked/positive value, e.g. data.positive={values[-1] if values else 1}, or "
                                f"data.label to the label column."])
        positive = next(v for v in values if is_positive(v, ""))
    if positive not in values:
        raise TabularError([f"data.positive={positive}: no row of column {label!r} has that value; its values: "
                            f"{', '.join(values[:10])}. Set data.positive to the clicked/positive one."])
    negatives = {negative} if negative else set(values) - {positive}
    if not negative and len(negatives) != 1:
        raise TabularError([f"data.label={label}: has {len(values)} values ({', '.join(values[:10])}); with "
                            f"data.positive={positive} the negative one is ambiguous. Set data.negative=<value>."])
    unknown = sorted(set(values) - negatives - {positive})
    if unknown:
        raise TabularError([f"data.label={label}: values {', '.join(unknown[:10])} are neither data.positive="
                            f"{positive} nor data.negative={negative}. Fix the file or set data.negative."])
    return positive


FLOAT32_MAX = float(np.finfo(np.float32).max)
"""A continuous value beyond +-this is inf once a rank keeps it as float32."""


def not_finite(floats: np.ndarray) -> np.ndarray:
    """Whether each value is inf, -inf or beyond float32 (a rank keeps float32); NaN (missing) is not."""
    with np.errstate(invalid="ignore"):
        return np.abs(floats) > FLOAT32_MAX


class Finite:
    """The continuous values no standardisation survives, counted per column as batches come (``add``) and refused
    with the fixes once all are seen (``check``): such a column's mean or standard deviation is inf, every value of
    it NaN after standardising, and the run diverges at step 1. NaN is a missing value (the train mean), not one."""

    def __init__(self, where: str) -> None:
        self.where = where
        """The file (and row group) the values come from, as the message names it."""
        self.seen: dict[str, tuple[int, int, float]] = {}
        """column -> (values not finite, the first one's data row, its value)."""

    def add(self, column: str, floats: np.ndarray, first_row: int = 1) -> None:
        """A column's values from data row ``first_row`` on."""
        bad = np.flatnonzero(not_finite(floats))
        if len(bad):
            n, row, value = self.seen.get(column, (0, first_row + int(bad[0]), float(floats[bad[0]])))
            self.seen[column] = (n + len(bad), row, value)

    def check(self) -> None:
        if self.seen:
            raise TabularError([
                f"{self.where}: continuous column {h!r} holds {n:,} value(s) that are not finite numbers (inf, -inf, "
                f"or beyond float32's +-3.4e38), the first {value!r} at data row {row:,}; standardised, the column "
                f"would be NaN and training would diverge at step 1. Clean the column (an empty cell or a null is a "
                f"missing value: the train mean), or set data.categorical=[{h}] to take its values as categories, or "
                f"data.drop=[{h}]." for h, (n, row, value) in self.seen.items()])
