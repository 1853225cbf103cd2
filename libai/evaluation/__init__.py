"""Evaluation: evaluators (perplexity, top-k accuracy) and the inference loop.

Every evaluator reduces its statistics over data-parallel ranks in ``evaluate()``: call it on
all ranks; all ranks get the same results.
"""

from libai.evaluation.cls_evaluator import AccEvaluator, ClsEvaluator
from libai.evaluation.evaluator import DatasetEvaluator, DatasetEvaluators, inference_on_dataset
from libai.evaluation.ppl_evaluator import PPLEvaluator
from libai.evaluation.utils import (
    all_reduce_over_data_parallel,
    flatten_results_dict,
    print_csv_format,
)

__all__ = [
    "AccEvaluator",
    "ClsEvaluator",
    "DatasetEvaluator",
    "DatasetEvaluators",
    "PPLEvaluator",
    "all_reduce_over_data_parallel",
    "flatten_results_dict",
    "inference_on_dataset",
    "print_csv_format",
]
