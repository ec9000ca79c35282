"""Typed settings of the Criteo data path; the schema lives with the other Hydra schemas in
:mod:`dmt.config` and is re-exported here."""

from dmt.config import (  # noqa: F401
    CriteoConfig,
    DEFAULT_SPLIT_FRACTIONS,
    DEFAULT_TRAIN_DAYS,
    DEFAULT_EVAL_DAY,
    CATEGORICAL_MODES,
)
