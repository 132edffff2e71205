#!/usr/bin/env python3
"""Layering check: every component's #include lines against DESIGN.md's allowed-dependency table.

DESIGN.md ("Layers and folders"): proto -> runtime (+ collective) -> dispatch -> workers_api;
workers and driver both sit on workers_api; algos sits on proto and is used by both. No cycles.
driver must not link fsdp, rollout or collective. Only proto/ sees generated Cap'n Proto code.
Headers keep <torch/torch.h> out (build-time budget). app/ is the composition root and may use
everything.

Exit status 0 when clean; otherwise one line per forbidden edge, naming file:line and the edge.
"""
import pathlib
import re
import sys

# component -> folder (longest prefix wins when mapping a path to its component)
FOLDERS = {
    "proto": "proto",
    "collective": "runtime/collective",
    "runtime": "runtime",
    "dispatch": "dispatch",
    "workers_api": "workers/api",
    "algos": "workers/algos",
    "tokenizer": "workers/tokenizer",
    "jinja": "workers/tokenizer/jinja",
    "models": "workers/models",
    "fsdp": "workers/fsdp",
    "rollout": "workers/rollout",
    "ppo": "workers/ppo",
    "workers": "workers/roles",
    "driver": "driver",
    "app": "app",
}

# component -> components it may include (besides itself). Transcribed from DESIGN.md.
ALLOWED = {
    "proto": set(),
    "collective": {"proto"},
    "runtime": {"proto", "collective"},
    "dispatch": {"proto", "runtime", "collective"},
    "workers_api": {"proto", "runtime", "collective", "dispatch"},
    "algos": {"proto"},
    "jinja": {"proto"},
    "tokenizer": {"proto", "jinja"},
    "models": {"proto", "tokenizer"},
    "fsdp": {"proto", "collective", "models"},
    "rollout": {"proto", "collective", "runtime", "dispatch", "workers_api", "tokenizer", "models", "fsdp"},
    "ppo": {"proto", "collective", "algos", "models", "fsdp"},
    "workers": {"proto", "collective", "runtime", "dispatch", "workers_api", "algos", "tokenizer", "models",
                "fsdp", "rollout", "ppo"},
    # The driver sits on workers_api; it must never reach FSDP, rollout, PPO or the collectives.
    "driver": {"proto", "runtime", "dispatch", "workers_api", "algos", "tokenizer", "models"},
    "app": set(FOLDERS) - {"app"},
}

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
SOURCE_SUFFIXES = {".hpp", ".h", ".cpp", ".cc", ".cxx", ".cu", ".cuh"}


def component_of(rel_path: str):
    best = None
    for comp, folder in FOLDERS.items():
        if rel_path == folder or rel_path.startswith(folder + "/"):
            if best is None or len(folder) > len(FOLDERS[best]):
                best = comp
    return best


def check(root: pathlib.Path):
    problems = []
    files = 0
    for path in sorted(root.rglob("*")):
        if path.suffix not in SOURCE_SUFFIXES or not path.is_file():
            continue
        rel = path.relative_to(root).as_posix()
        if rel.startswith(("build", "tests/", "bench/", ".")):
            continue
        comp = component_of(rel)
        if comp is None:
            continue
        files += 1
        for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = INCLUDE_RE.match(line)
            if not m:
                continue
            target = m.group(2)
            where = f"{rel}:{lineno}"
            if target.endswith(".capnp.h") and comp != "proto":
                problems.append(f"{where}: {comp} includes generated Cap'n Proto code ({target}); only proto/ may")
            if target == "torch/torch.h" and path.suffix in {".hpp", ".h"}:
                problems.append(f"{where}: header includes <torch/torch.h>; use <ATen/core/Tensor.h>")
            dep = component_of(target)
            if dep is None or dep == comp:
                continue
            # dep != comp here: a nested component (runtime/collective, workers/tokenizer/jinja)
            # keeps its internal/ private from the folder around it too.
            if "/internal/" in target:
                problems.append(f"{where}: {comp} includes {dep}'s private header {target}")
            if dep not in ALLOWED[comp]:
                problems.append(f"{where}: forbidden edge {comp} -> {dep} (#include \"{target}\")")
    return files, problems


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parents[2])
    files, problems = check(root.resolve())
    for p in problems:
        print(p)
    print(f"layering: checked {files} files, {len(problems)} forbidden edge(s)")
    return 1 if problems or files == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
