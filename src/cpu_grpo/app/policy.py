"""What the web page may touch: files under its runs directory and the `--data-dir` directories, and reward code
only with `--allow-code`. Whoever can reach the page can start processes on this machine.

The policy is applied twice: to the fields as typed (before a config file is even read), and to the configuration
the run will really have (profile, file, fields and, on resume, the run's saved config, resolved as `cpu-grpo
train` resolves them), so that a config file cannot bring in what the fields may not."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# a hub id as `datasets` and `transformers` take one: name or owner/name, no path syntax
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
# `datasets`' packaged builders (datasets.packaged_modules), which read local files: `hf:text` would read every
# file under the working directory
BUILDERS = ("arrow", "audiofolder", "cache", "conll", "csv", "eval", "fasta", "fastq", "generator", "genbank", "harbor",
            "hdf5", "iceberg", "imagefolder", "json", "lance", "meshfolder", "mmcif", "niftifolder", "pandas",
            "parquet", "pdb", "pdffolder", "spark", "sql", "text", "tsfile", "videofolder", "vortex", "webdataset",
            "xml")


def builder_names() -> set[str]:
    """The packaged builder names of the installed `datasets`, and BUILDERS (those of versions before or after)."""
    try:
        from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES
    except ImportError:
        return set(BUILDERS)
    return set(BUILDERS) | set(_PACKAGED_DATASETS_MODULES)


@dataclass(frozen=True)
class Policy:
    """What the page may touch: files under the runs directory and the data directories named at `cpu-grpo app`
    start (`--data-dir`), and code from reward files only with `--allow-code`. Whoever can reach the page can
    start processes on this machine: nothing it takes may read or run files elsewhere."""

    root: Path
    data_dirs: tuple[Path, ...] = ()
    allow_code: bool = False
    max_runs: int = 1  # training processes the page lets run at once (0: no cap)

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
        """Why a task spec may not be used: each part of a joined task is a level, a shipped dataset, a hub
        dataset named by its id (never a local path: `datasets` reads those too), or a file the page may read."""
        from ..data.generated import GENERATED
        from ..data.loaders import DATASETS, Task
        from ..data.tasks import LEVELS

        for part in Task.of(spec.strip()).parts:
            if not part or part in (*LEVELS, "mix", *DATASETS, *GENERATED) or part.startswith("rg:"):
                continue
            if part.startswith("hf:"):
                name = part[3:].partition(":")[0]
                if name.lower() in builder_names():
                    return (f"{field}: {part} is a `datasets` builder, which reads local files (every file under the "
                            "page's working directory): name a hub dataset (owner/name), or give a data file's path "
                            "under the runs or data directories.")
                if not _HUB_ID.fullmatch(name) or ".." in name or Path(name).expanduser().exists():
                    return (f"{field}: {part} does not name a hub dataset (owner/name): the page reads local files "
                            "only by their path, under the runs or data directories.")
                continue
            if problem := self.outside(field, part):
                return problem
        return None

    def model_problem(self, spec: str, field: str = "model") -> str | None:
        from ..engine.models import ALIASES

        spec = spec.strip()
        path = Path(spec).expanduser()
        if not spec or spec in ALIASES or (_HUB_ID.fullmatch(spec) and "/" in spec and not path.exists()
                                           and ".." not in spec):
            return None  # an alias, or a hub id
        return self.outside(field, spec)

    def reward_problem(self, rewards: list[str], where: str = "rewards") -> str | None:
        from ..data.rewards import BUILTIN_NAMES

        if self.allow_code or set(rewards) <= set(BUILTIN_NAMES):
            return None
        return (f"{where}: reward files and modules run their code; the page takes builtin rewards "
                f"({', '.join(BUILTIN_NAMES)}) unless the app was started with --allow-code.")

    def run_problem(self, run: Path) -> str | None:
        """Why the page may not train or evaluate into `run`: it must be a directory right under the runs directory
        (a link that leads elsewhere does not count)."""
        root = Path(self.root).resolve()
        if run.is_symlink() or run.resolve().parent != root or run.parent.resolve() != root:
            return f"run {run.name}: the page keeps runs as directories right under {root}; choose another run name."
        return None

    def export_problem(self, run: Path, ckpt: str, out: Path) -> str | None:
        """Why the page may not export `ckpt` of `run` into `out`: the checkpoint must be the run's own, and what is
        written stays under the runs directory."""
        if problem := self.run_problem(run):
            return problem
        where = Path(ckpt).expanduser().resolve()
        if where.parent != (run / "checkpoints").resolve():
            return f"checkpoint {ckpt}: the page exports the checkpoints of the chosen run only."
        return self.outside("export directory", str(out))

    def train_problem(self, model: str, config_file: str, overrides: dict) -> str | None:
        """The fields as typed, checked before anything they name is read."""
        rewards = [r.strip() for r in str(overrides.get("rewards") or "").split(",") if r.strip()]
        stages = [st.partition(":")[0] for st in str(overrides.get("stages") or "").split(",")]
        evals = str(overrides.get("eval_task") or "").split(",")
        checks = [self.reward_problem(rewards), self.model_problem(model or ""),
                  self.outside("config file", config_file) if config_file else None,
                  self.task_problem("task", str(overrides.get("task") or ""))]
        checks += [self.task_problem("stages", s) for s in stages] + [self.task_problem("eval_task", e) for e in evals]
        return next((c for c in checks if c), None)

    def config_problem(self, cfg, run: Path, source: str) -> str | None:
        """The configuration the run will have (a TrainConfig, resolved from `source`: the profile, the file, the
        fields and a resumed run's saved config): every reward, the model and its code, every task of every stage
        and every extra held-out set, and where it writes."""
        from ..config.stages import plan

        if cfg.trust_remote_code:
            return (f"{source} sets trust_remote_code: the page never runs a model's own code; start that run with "
                    "`cpu-grpo train`.")
        if Path(cfg.output_dir).resolve() != run.resolve():
            return f"{source} writes the run to {cfg.output_dir}: the page keeps runs in its runs directory."
        tasks = [("task", cfg.task)] + [(f"stage {s.name}", s.task) for s in plan(cfg)]
        tasks += [("eval_task", t) for t in cfg.eval_task.split(",") if t.strip()]
        checks = [self.reward_problem(cfg.rewards, f"{source}: rewards"),
                  self.model_problem(cfg.model, f"{source}: model")]
        checks += [self.task_problem(f"{source}: {field}", spec) for field, spec in tasks]
        return next((c for c in checks if c), None)
