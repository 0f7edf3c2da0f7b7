"""An installed copy (a wheel, not the editable checkout) finds its config tree and recipes."""

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_ships_conf_and_recipes_and_works_installed(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(ROOT)],
        check=True, capture_output=True,
    )
    (wheel,) = tmp_path.glob("hetero_launch-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        "launcher/conf/config.yaml",
        "launcher/conf/recipe/wide_deep.yaml",
        "launcher/conf/recipe/quickstart.yaml",
        "launcher/conf/hydra/help/hetero_launch.yaml",
        "launcher/recipes/wide_deep/model.py",
        "launcher/recipes/quickstart/data.py",
        "launcher/facts/activations.py",
    ):
        assert needed in names, needed
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)], check=True, capture_output=True)
    code = (
        "import launcher, sys\n"
        f"assert launcher.__file__.startswith({str(site)!r}), launcher.__file__\n"
        "from launcher.cli import main\n"
        "sys.exit(main(['recipe=wide_deep', 'dry_run=true']))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (tmp_path / "log_output" / "latest" / "plan.json").is_file()
