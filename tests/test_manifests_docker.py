"""The container images per device kind (examples/dockerfiles/): every image a cluster profile names is built by a
Dockerfile there, and each Dockerfile installs heteroflow from the build context with nothing the package needs
left out by its .dockerignore. (Building them needs Docker and the registries; not done here.)"""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "examples" / "dockerfiles"
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")))
    out = []
    for line in text.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _image_of(path: Path) -> str:
    m = re.search(r"^# image: (\S+)$", path.read_text(), re.M)
    assert m, f"{path.name} names no image"
    return m.group(1)


def test_every_profile_image_has_a_dockerfile() -> None:
    built = {_image_of(p): p.name for p in DOCKERFILES}
    assert {"cpu.Dockerfile", "cuda.Dockerfile", "cann.Dockerfile"} <= set(built.values())
    for profile in sorted((ROOT / "examples" / "profiles").glob("*.yaml")):
        text = profile.read_text()
        for kind, image in (yaml.safe_load(text).get("images") or {}).items():
            assert image in built, f"{profile.name}: images.{kind}={image} is built by no Dockerfile in examples/docker"
            assert f"examples/dockerfiles/{built[image]}" in text  # the profile says which


@pytest.mark.parametrize("path", DOCKERFILES, ids=[p.name for p in DOCKERFILES])
def test_dockerfile_installs_heteroflow_from_the_context(path: Path) -> None:
    steps = _instructions(path)
    words = [w for w, _ in steps]
    assert all(w == "ARG" for w in words[: words.index("FROM")])  # only build arguments before FROM
    assert ("COPY", ". /src") in steps
    runs = " ".join(a for w, a in steps if w == "RUN")
    assert re.search(r'pip install "/src\[[a-z0-9,]+\]"', runs)
    assert "heteroflow --help" in runs  # the build fails if the CLI does not start
    assert re.search(r"torch==\$\{TORCH_VERSION\}", runs)
    assert words[-1] == "ENTRYPOINT"


@pytest.mark.parametrize("path", DOCKERFILES, ids=[p.name for p in DOCKERFILES])
def test_dockerignore_keeps_what_the_package_needs(path: Path) -> None:
    ignore = Path(f"{path}.dockerignore")
    patterns = [line.strip() for line in ignore.read_text().splitlines() if line.strip() and not line.startswith("#")]

    def ignored(rel: str) -> bool:  # Docker's rule: the last matching pattern wins; "!" re-includes
        result = False
        for pat in patterns:
            neg = pat.startswith("!")
            p = pat[1:] if neg else pat
            if fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(rel, p.rstrip("/") + "/*") or (p == "**"):
                result = not neg
        return result

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    folders = pyproject["tool"]["setuptools"]["package-dir"].values()
    needed = ["pyproject.toml", "README.md"] + [f"{d}/{f.name}" for d in folders for f in (ROOT / d).iterdir() if f.suffix == ".py"]
    assert [n for n in needed if ignored(n)] == []
    assert ignored(".venv/bin/python") and ignored("tests/test_manifests.py")
