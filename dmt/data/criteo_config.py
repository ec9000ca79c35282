"""Typed settings of the Criteo data path; the schema lives with the other Hydra schemas in
:mod:`dmt.config` and is re-exported here."""

from dmt.config import (  # noqa: F401
    CATEGORICAL_MODES,
    DEFAULT_EVAL_DAY,
    DEFAULT_SPLIT_FRACTIONS,
    DEFAULT_TRAIN_DAYS,
    MISSING_IDS,
    CriteoConfig,
)
