import sys, os
from cpu_grpo import rollout, cli
SYSTEM = os.environ["SYS"]
def encode_prompts(tokenizer, questions, instruction=""):
    out = []
    for q in questions:
        content = f"{q}\n{instruction}".strip() if instruction else q
        text = tokenizer.apply_chat_template([{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}], tokenize=False, add_generation_prompt=True)
        out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return out
rollout.encode_prompts = encode_prompts
import cpu_grpo.evaluate as ev
if hasattr(ev, "encode_prompts"): ev.encode_prompts = encode_prompts
sys.exit(cli.main(sys.argv[1:]))
