"""GSM8K's 1,319 test problems for the base, seed-0 and seed-1 models: the first 500 from
results/default-gsm8k-first500-*, lines 501-1319 from results/default-gsm8k-full (ids renamed test.jsonl:N).
Run from the repository root."""
import gzip
import json

R = "results"  # run from the repository root; writes /tmp/<model>-1319.jsonl
first = {"base": f"{R}/default-gsm8k-first500-seed1/base.jsonl.gz",
         "seed0": f"{R}/default-gsm8k-first500-seed0/seed0.jsonl.gz",
         "seed1": f"{R}/default-gsm8k-first500-seed1/seed1.jsonl.gz"}
for m, f in first.items():
    a = [json.loads(line) for line in gzip.open(f, "rt")]
    b = [json.loads(line) for line in gzip.open(f"{R}/default-gsm8k-full/{m}.jsonl.gz", "rt")]
    assert len(a) == 500 and len(b) == 819, (len(a), len(b))
    for r in b:
        name, k = r["id"].rsplit(":", 1)
        assert name == "test-501-1319.jsonl"
        r["id"] = f"test.jsonl:{500 + int(k)}"
    ids = [r["id"] for r in a + b]
    assert ids == [f"test.jsonl:{i}" for i in range(1, 1320)], "ids not 1..1319 in order"
    with open(f"/tmp/{m}-1319.jsonl", "w") as out:
        out.writelines(json.dumps(r) + "\n" for r in a + b)
    print(m, sum(r["correct"] for r in a), sum(r["correct"] for r in b), sum(r["correct"] for r in a + b))
