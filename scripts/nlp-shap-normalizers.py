"""Writes the reference values of nlp-shap's display normalizers, which lmhost's `normalize`
setting must reproduce: explain/tests/data/nlp_shap_normalizers.json.

Needs Python >= 3.12 with `nlp-shap` (PyPI, 0.2.1):
    python3.12 -m venv /tmp/ns && /tmp/ns/bin/pip install nlp-shap==0.2.1
    /tmp/ns/bin/python scripts/nlp-shap-normalizers.py > explain/tests/data/nlp_shap_normalizers.json
"""

import json
import sys

import nlp_shap
from nlp_shap.estimation.normalizers import (
    AbsSumNormalizer,
    IdentityNormalizer,
    MinMaxNormalizer,
    PowerShiftNormalizer,
)

VALUES = [
    [0.5, -0.25, 1.0, 0.0],
    [-2.0, -1.0, -3.0],
    [1.0, 1.0, 1.0],
    [0.0, 0.0],
    [3.2e-3, -7.5e-4, 1.1e-2, 4.0e-5, -2.2e-3],
    [-40.3012, 6.579, 0.0001136, 12.5, -3.0, 7.25],
]
NORMALIZERS = [
    ("identity", None, IdentityNormalizer()),
    ("abs_sum", None, AbsSumNormalizer()),
    ("min_max", None, MinMaxNormalizer()),
    ("power_shift", 1.0, PowerShiftNormalizer(power=1.0)),
    ("power_shift", 2.0, PowerShiftNormalizer(power=2.0)),
    ("power_shift", 0.5, PowerShiftNormalizer(power=0.5)),
]

cases = [
    {"normalizer": name, "power": power, "values": values, "normalized": n.normalize(values)}
    for values in VALUES
    for name, power, n in NORMALIZERS
]
json.dump({"nlp_shap": nlp_shap.__version__, "cases": cases}, sys.stdout, indent=1)
print()
