"""What the web page may touch: files under its runs directory and the `--data-dir` directories, and reward code
only with `--allow-code`. Whoever can reach the page can start processes on this machine."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Policy:
    """What the page may touch: files under the runs directory and the data directories named at `cpu-grpo app`
    start (`--data-dir`), and code from reward files only with `--allow-code`. Whoever can reach the page can
    start processes on this machine: nothing it takes may read or run files elsewhere."""

    root: Path
    data_dirs: tuple[Path, ...] = ()
    allow_code: bool = False

    def outside(self, field: str, value: str) -> str | None:
        """Why a path typed into `field` may not be used (outside every allowed directory), or None."""
        path = Path(value).expanduser()
        where = (path if path.is_absolute() else Path.cwd() / path).resolve()
        allowed = [Path(d).resolve() for d in (self.root, *self.data_dirs)]
        if any(where == a or a in where.parents for a in allowed):
            return None
        return (f"{field}: {value} is outside the runs directory{' and the data directories' if self.data_dirs else ''}"
                "; put it there, or start the app with --data-dir naming its directory.")

    def task_problem(self, field: str, spec: str) -> str | None:
        from ..loaders import DATASETS
        from ..tasks import LEVELS

        spec = spec.strip()
        if not spec or spec in (*LEVELS, "mix", *DATASETS) or spec.startswith("hf:"):
            return None
        return self.outside(field, spec)

    def model_problem(self, spec: str) -> str | None:
        from ..models import ALIASES

        spec = spec.strip()
        path = Path(spec).expanduser()
        if not spec or spec in ALIASES or (spec.count("/") == 1 and not path.exists() and not spec.startswith(".")):
            return None  # an alias, or a hub id
        return self.outside("model", spec)

    def train_problem(self, model: str, config_file: str, overrides: dict) -> str | None:
        from ..rewards import BUILTIN_NAMES

        rewards = [r.strip() for r in str(overrides.get("rewards") or "").split(",") if r.strip()]
        if rewards and not self.allow_code and not set(rewards) <= set(BUILTIN_NAMES):
            return ("rewards: reward files and modules run their code; the page takes builtin rewards "
                    f"({', '.join(BUILTIN_NAMES)}) unless the app was started with --allow-code.")
        stages = [st.partition(":")[0] for st in str(overrides.get("stages") or "").split(",")]
        evals = str(overrides.get("eval_task") or "").split(",")
        checks = [self.model_problem(model or ""), self.outside("config file", config_file) if config_file else None,
                  self.task_problem("task", str(overrides.get("task") or ""))]
        checks += [self.task_problem("stages", s) for s in stages] + [self.task_problem("eval_task", e) for e in evals]
        return next((c for c in checks if c), None)
