"""The repository's promises: the README's two commands, CI running the same test command,
and the three dependency lists (pyproject, environment.yml, binder/) agreeing."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
# conda-forge names for the PyPI packages kvlab needs
CONDA_NAME = {"torch": "pytorch-cpu"}
RUNTIME_EXTRAS = ("engine", "course")


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, flags=re.S)]


def test_readme_gives_exactly_two_commands() -> None:
    commands = readme_commands()
    assert len(commands) == 2, commands
    assert all("\n" not in c for c in commands), "each command is one line"
    assert "jupyter lab notebooks/00_start_here.ipynb" in commands[0]
    assert "pytest" in commands[1]
    assert (ROOT / "notebooks" / "00_start_here.ipynb").exists() or "notebooks" in commands[0]


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    lines = [line.strip() for line in ci.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert readme_commands()[1] in lines, "the README's test command must appear verbatim in .ci/run"
    assert "torch==2.13.0" in readme_commands()[1]


def _requirement_name(req: str) -> str:
    return re.split(r"[<>=!~\[ ;]", req.strip(), maxsplit=1)[0].lower()


def _pyproject_runtime() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    names = {_requirement_name(r) for r in project["dependencies"]}
    for extra in RUNTIME_EXTRAS:
        names |= {_requirement_name(r) for r in project["optional-dependencies"][extra]}
    return {CONDA_NAME.get(n, n) for n in names}


def _conda_packages(path: Path) -> tuple[set[str], list]:
    env = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert "conda-forge" in env["channels"]
    names, pip = set(), []
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            pip = dep.get("pip", [])
        else:
            names.add(_requirement_name(dep))
    return names - {"python", "pip"}, pip


@pytest.mark.parametrize("path", ["environment.yml", "binder/environment.yml"])
def test_environment_files_agree_with_pyproject(path: str) -> None:
    names, _ = _conda_packages(ROOT / path)
    assert names == _pyproject_runtime()
    assert "pytorch" not in names, "use the CPU-only build (pytorch-cpu), never the CUDA one"


def test_top_level_environment_installs_kvlab_from_the_repository() -> None:
    _, pip = _conda_packages(ROOT / "environment.yml")
    assert "-e ." in pip


def test_binder_installs_kvlab_and_opens_the_start_page() -> None:
    post_build = (ROOT / "binder" / "postBuild").read_text(encoding="utf-8")
    assert "pip install --no-deps -e ." in post_build
    assert "00_start_here.ipynb" in post_build
    assert "00_start_here.ipynb" in (ROOT / "README.md").read_text(encoding="utf-8").split("\n## ", 1)[0]


@pytest.mark.skipif(
    shutil.which("jupyter-repo2docker") is None, reason="jupyter-repo2docker is not installed"
)
def test_repo2docker_uses_the_binder_folder() -> None:
    out = subprocess.run(
        ["jupyter-repo2docker", "--no-build", "--debug", str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-2000:]
    assert "binder/environment.yml" in text
    assert "binder/postBuild" in text
    assert re.search(r"COPY .*src/environment\.yml", text) is None, (
        "top-level environment.yml must be ignored"
    )


def test_python_version_is_supported() -> None:
    assert sys.version_info >= (3, 10)
