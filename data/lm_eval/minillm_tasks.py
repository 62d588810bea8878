"""The datasets of the tasks beside this file, read from their JSONL files here.

lm-evaluation-harness calls `custom_dataset` with the task's `dataset_kwargs`; a
path in the YAML itself would be read relative to the working directory, so the
files are found from this file's folder instead, wherever lm_eval runs.
"""
import json
from pathlib import Path


def load_jsonl(file: str, **_ignored):
    import datasets
    with open(Path(__file__).parent / file) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})
