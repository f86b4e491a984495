"""Writes a multiple-choice dataset with its own train and test splits, as `datasets` saves one, with column names
of its own (`problem`, `label`): `python examples/disk-task/make_dataset.py OUT_DIR` (needs `pip install datasets`)."""

import random
import sys

from datasets import Dataset, DatasetDict


def rows(seed: int, n: int) -> list[dict]:
    rng, out = random.Random(seed), []
    for _ in range(n):
        a, b = rng.randint(2, 40), rng.randint(2, 40)
        right = a + b
        options = rng.sample([right, right + 1, right - 2, right + 10], 4)
        letters = "ABCD"
        text = f"What is {a} + {b}?\n" + "\n".join(f"({x}) {v}" for x, v in zip(letters, options, strict=True))
        out.append({"problem": text + "\nEnd with 'The answer is (X)'.", "label": letters[options.index(right)]})
    return out


if __name__ == "__main__":
    splits = {"train": Dataset.from_list(rows(0, 60)), "test": Dataset.from_list(rows(1, 20))}
    DatasetDict(splits).save_to_disk(sys.argv[1])
