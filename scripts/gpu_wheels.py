"""Download exactly the wheels the GPU machine lacks, unpacked into a folder to carry and put on PYTHONPATH.

The H200 machine of ``../shared/GPU.md`` has Python 3.12, torch 2.11+cu130, transformers, pyarrow,
huggingface_hub, safetensors, tokenizers, sentencepiece, psutil, nvidia-ml-py and pytest, and no
network. It lacks what ``WHEELS`` lists: omegaconf (2.4 needs only PyYAML, which is there, not antlr4),
bitsandbytes (the flagship optimizer), datasets with dill and multiprocess (the recipe's data), and,
for the side-by-side of ``benchmarks/gpu_proof.py``, torchtune 0.6.1 with torchao 0.11.

    python scripts/gpu_wheels.py            # -> .gpu_carry/site and .gpu_carry/tt061 (git-ignored)
    # on the GPU machine, from the repository root:
    PYTHONPATH=$PWD:$PWD/.gpu_carry/site python3 benchmarks/gpu_proof.py

Wheels are fetched for Python 3.12 manylinux x86_64 whatever Python runs this (``pip download
--only-binary=:all: --python-version 3.12 --platform ... --no-deps``) and unpacked, not installed: a
wheel is a zip of the files an install would lay out, and unpacking needs no pip on the GPU machine
(pip on another Python refuses a ``py312`` wheel such as multiprocess's). Two trims keep the carry
small: bitsandbytes keeps only its CPU and CUDA 13.0 libraries (its wheel is 43 MB of libraries for
every CUDA version and ROCm; torch 2.11+cu130 loads ``libbitsandbytes_cuda130.so``), and torchao loses
its C++ extension (built for another torch; torchtune 0.6.1's recipe does not use it, and torchao
skips it when absent). The folder and the repository's tree must travel together in 64 MiB: the
script checks that and fails past it.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20
CARRY_LIMIT_MIB = 64  # what the device machine takes: tracked files plus carried folders
PYTHON_VERSION = "3.12"
PLATFORMS = ["manylinux2014_x86_64", "manylinux_2_24_x86_64", "manylinux_2_28_x86_64"]
# folder -> requirements unpacked into it. "site" goes on our PYTHONPATH; "tt061" (torchtune 0.6.1, which
# is also called ``torchtune``) only on the PYTHONPATH of torchtune's own runs, beside "site".
WHEELS = {
    "site": [
        "omegaconf==2.4.0",
        "bitsandbytes==0.50.2",
        "datasets==5.2.0",
        "dill==0.4.1",
        "multiprocess==0.70.19",
        "liger-kernel==0.8.5",
    ],
    "tt061": ["torchtune==0.6.1", "torchao==0.11.0", "torchdata==0.11.0"],
}
# top-level modules each folder provides (what the import test of tests/benchmarks lets through)
PROVIDES = {
    "site": ["omegaconf", "bitsandbytes", "datasets", "dill", "multiprocess", "_multiprocess", "liger_kernel"],
    "tt061": ["torchtune", "recipes", "torchao", "torchdata"],
}
# what the H200 machine has (GPU.md), as distributions: they and their dependencies are its package set
# (tests/_helpers/gpu_machine.py builds an environment of exactly those plus WHEELS to find a missing wheel)
H200_DISTRIBUTIONS = [
    "torch",
    "pyarrow",
    "huggingface_hub",
    "fsspec",
    "pandas",
    "transformers",
    "safetensors",
    "tokenizers",
    "sentencepiece",
    "tiktoken",
    "xxhash",
    "psutil",
    "tqdm",
    "nvidia-ml-py",
    "pytest",
    "pytest-timeout",
]
BNB_KEEP = ("libbitsandbytes_cpu.so", "libbitsandbytes_cuda130.so")


def tree_bytes(root: Path = REPO_ROOT) -> int:
    """Bytes of what the device copies of the working tree: tracked files and untracked, not ignored ones.
    Without git (a copy of the tree, as on the device machine): every file but caches and carried folders."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=root,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".venv", ".gpu_carry", "__pycache__", ".pytest_cache"}
        files = (p for p in root.rglob("*") if not skip.intersection(p.relative_to(root).parts))
        return sum(p.stat().st_size for p in files if p.is_file() and not p.is_symlink())
    names = (name for name in out.decode().split("\0") if name)
    return sum((root / name).stat().st_size for name in names if (root / name).is_file())


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def _trim(folder: Path) -> None:
    for lib in (folder / "bitsandbytes").glob("libbitsandbytes_*"):
        if lib.name not in BNB_KEEP:
            lib.unlink()
    for ext in (folder / "torchao").glob("_C*.so"):
        ext.unlink()
    for cache in folder.rglob("__pycache__"):
        shutil.rmtree(cache, ignore_errors=True)


def download(dest: Path, folders: list[str]) -> None:
    """Fetch and unpack the wheels of ``folders`` into ``dest/<folder>`` (replaced)."""
    with tempfile.TemporaryDirectory(prefix="gpu-wheels-") as tmp:
        for folder in folders:
            wheels = Path(tmp) / folder
            command = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--no-deps"]
            command += ["--python-version", PYTHON_VERSION, "--dest", str(wheels)]
            for platform in PLATFORMS:
                command += ["--platform", platform]
            subprocess.run(command + WHEELS[folder], check=True)
            target = dest / folder
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True)
            for wheel in sorted(wheels.glob("*.whl")):
                with zipfile.ZipFile(wheel) as archive:
                    archive.extractall(target)
            _trim(target)


def check_total(dest: Path, limit_mib: float = CARRY_LIMIT_MIB) -> tuple[int, int]:
    """(carried folder bytes, tree bytes); SystemExit if together they pass ``limit_mib``."""
    carry, tree = folder_bytes(dest), tree_bytes()
    total = (carry + tree) / MIB
    if total > limit_mib:
        raise SystemExit(
            f"{dest} ({carry / MIB:.1f} MiB) and the repository's tree ({tree / MIB:.1f} MiB) make {total:.1f} MiB, "
            f"past the {limit_mib} MiB the device machine takes: leave torchtune 0.6.1 out (--no-torchtune) or "
            "trim the largest files of the folder."
        )
    return carry, tree


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", default=str(REPO_ROOT / ".gpu_carry"), help="folder to fill (git-ignored)")
    parser.add_argument(
        "--no-torchtune", dest="torchtune", action="store_false", help="without torchtune 0.6.1 and torchao"
    )
    parser.add_argument("--check-only", action="store_true", help="only check the size of an existing --dest")
    args = parser.parse_args(argv)
    dest = Path(args.dest)
    if not args.check_only:
        download(dest, ["site", "tt061"] if args.torchtune else ["site"])
    carry, tree = check_total(dest)
    for folder in sorted(p for p in dest.iterdir() if p.is_dir()):
        print(f"{folder}: {folder_bytes(folder) / MIB:.1f} MiB")
    print(
        f"carried {carry / MIB:.1f} MiB + tree {tree / MIB:.1f} MiB = {(carry + tree) / MIB:.1f} MiB "
        f"(limit {CARRY_LIMIT_MIB} MiB)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
