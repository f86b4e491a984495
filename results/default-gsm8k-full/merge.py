"""All 1,319: the first 500 from sessions 27/28's files, lines 501-1319 from this session's (ids renamed)."""
import json, sys
O = "docs/runs/default-s29-gsm8k-full"  # run from the repository root; writes /tmp/<model>-1319.jsonl
first = {"base": "docs/runs/default-s27-gsm8k/base.jsonl", "seed0": "docs/runs/default-s28-gsm8k/seed0.jsonl",
         "seed1": "docs/runs/default-s27-gsm8k/seed1.jsonl"}
for m, f in first.items():
    a = [json.loads(l) for l in open(f)]
    b = [json.loads(l) for l in open(f"{O}/{m}.jsonl")]
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
