"""The command line as a user meets it: dry runs, help, config printing, and errors before anything starts.

A few run the real command in a subprocess (run_cli: exit 2 and no traceback from a real process, help, the
launcher's own port and address checks); the others call its main in this process (the cli fixture), which is
what the subprocess would run."""

import json
import subprocess
import sys

from tests.conftest import run_cli


def test_dry_run_prints_plan_and_deepspeed_json_and_starts_nothing(tmp_path, cli):
    res = cli(["recipe=wide_deep", "dry_run=true", "zero.stage=2"], tmp_path)
    assert res.returncode == 0, res.stderr
    assert "plan: recipe wide_deep, 2 rank(s) on cpu" in res.stdout
    assert '"train_batch_size": 2048' in res.stdout and '"stage": 2' in res.stdout
    run = (tmp_path / "log_output" / "latest").resolve()
    assert run.parent == tmp_path / "log_output" and run.name.startswith("wide_deep-")
    for name in ("config.yaml", "plan.json", "ds_config.json", "rank_table.json", "rank_env.json", "versions.json"):
        assert (run / name).is_file(), name
    assert json.loads((run / "ds_config.json").read_text())["zero_optimization"] == {"stage": 2}
    assert not list(run.glob("rank.*")) and not (run / "summary.json").exists()  # no rank was started
    assert not (tmp_path / "outputs").exists()  # Hydra scatters nothing


def test_dry_run_does_not_import_deepspeed(tmp_path):
    code = (
        "import sys\nfrom launcher.cli import main\n"
        "assert main(['recipe=quickstart', 'dry_run=true']) == 0\n"
        "assert 'deepspeed' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True, capture_output=True)


def test_unknown_key_exits_2_with_did_you_mean_and_no_run_dir(tmp_path):
    res = run_cli(["recipe=wide_deep", "trainer.stepz=3"], tmp_path)
    assert res.returncode == 2
    assert "trainer.stepz: no such key (value 3). Did you mean trainer.steps? Write trainer.steps=3." in res.stderr
    assert "Traceback" not in res.stderr + res.stdout
    assert not (tmp_path / "log_output").exists()


def test_bad_value_type_exits_2(tmp_path, cli):
    res = cli(["recipe=quickstart", "batch.micro_size=big"], tmp_path)
    assert res.returncode == 2 and "batch.micro_size=big" in res.stderr and "Traceback" not in res.stderr


def test_impossible_batch_split_exits_2_with_formula(tmp_path, cli):
    res = cli(["recipe=wide_deep", "batch.global_size=10", "batch.micro_size=4"], tmp_path)
    assert res.returncode == 2 and "global 10 != micro 4 × accum 1 × dp 2" in res.stderr


def test_help_lists_recipes(tmp_path):
    res = run_cli(["--help"], tmp_path)
    assert res.returncode == 0
    assert "recipe: gpt, mnist_mlp, quickstart, resnet, wide_deep" in res.stdout
    assert "hetero-launch recipe=<name>" in res.stdout


def test_cfg_job_prints_composed_config(tmp_path, cli):
    res = cli(["recipe=quickstart", "trainer.steps=7", "--cfg", "job"], tmp_path)
    assert res.returncode == 0, res.stderr
    assert "name: quickstart" in res.stdout and "steps: 7" in res.stdout
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "log_output").exists()


def test_existing_run_name_is_never_overwritten(tmp_path, cli):
    assert cli(["recipe=quickstart", "dry_run=true", "output.run_name=mine"], tmp_path).returncode == 0
    res = cli(["recipe=quickstart", "dry_run=true", "output.run_name=mine"], tmp_path)
    assert res.returncode == 2 and "output.run_name=mine" in res.stderr and "never overwritten" in res.stderr


def test_script_and_recipe_together_are_refused(tmp_path, cli):
    res = cli(["recipe=gpt", "script=train.py"], tmp_path)
    assert res.returncode == 2 and "script= and recipe=gpt were both given" in res.stderr


def test_resume_from_a_folder_that_is_no_checkpoint(tmp_path, cli):
    res = cli(["recipe=quickstart", f"trainer.resume_from={tmp_path}"], tmp_path)
    assert res.returncode == 2 and f"trainer.resume_from={tmp_path}: not a checkpoint dir" in res.stderr
    (tmp_path / "checkpoint.json").write_text('{"step": 3, "rec')  # cut short by a crash
    res = cli(["recipe=quickstart", f"trainer.resume_from={tmp_path}"], tmp_path)
    assert res.returncode == 2 and "cannot be read" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "log_output").exists()


def test_a_busy_master_port_exits_2_before_any_run_dir(tmp_path):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = run_cli(["recipe=quickstart", f"cluster.master_port={port}"], tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert f"cluster.master_port={port} on cluster.master_addr=127.0.0.1: the launcher cannot listen there" in res.stderr
    assert "set cluster.master_port=0 (a free port, the default)" in res.stderr
    assert not (tmp_path / "log_output").exists()


def test_a_master_addr_that_is_not_this_host_exits_2_at_once(tmp_path):
    res = run_cli(["recipe=quickstart", "cluster.master_addr=not-a-host.invalid"], tmp_path, timeout=60)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "cluster.master_addr=not-a-host.invalid: not a host name this machine can resolve" in res.stderr
    assert not (tmp_path / "log_output").exists()


def test_an_address_of_another_machine_is_refused(tmp_path):
    import pytest

    from launcher.errors import ConfigError
    from launcher.launch.planning import check_local_address

    check_local_address("127.0.0.1")
    with pytest.raises(ConfigError, match=r"cluster.master_addr=192.0.2.1: not an address of this host"):
        check_local_address("192.0.2.1")  # TEST-NET-1: documentation only, never a local address
    for args in (["recipe=quickstart", "dry_run=true"], ["check", "recipe=quickstart"]):  # they accepted it
        res = run_cli([*args, "cluster.master_addr=192.0.2.1"], tmp_path)
        out = " ".join((res.stdout + res.stderr).split())
        assert res.returncode == 2 and "192.0.2.1: not an address of this host" in out, (args, out[-2000:])


def test_version_and_python_m_launcher_work_without_a_recipe(tmp_path):
    """--version prints hetero-launch's version and its engines'; ``python -m launcher`` is the same command."""
    import subprocess
    import sys
    from importlib.metadata import version

    res = subprocess.run([sys.executable, "-m", "launcher", "--version"], cwd=tmp_path, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"hetero-launch {version('hetero-launch')} (torch {version('torch')}, deepspeed "
                                 f"{version('deepspeed')}, hydra-core {version('hydra-core')}"), res.stdout
    assert not list(tmp_path.iterdir())  # nothing written
    res = subprocess.run([sys.executable, "-m", "launcher", "--version", "recipe=quickstart"], cwd=tmp_path,
                         capture_output=True, text=True)  # the word after it had been ignored
    assert res.returncode == 2 and "--version takes nothing after it (given: recipe=quickstart)" in res.stderr, res


def test_after_a_dry_run_latest_still_means_the_newest_run_that_trained(tmp_path, cli):
    """A dry run moves log_output/latest (its job.sbatch is there), but trainer.resume=latest and report take the
    newest run that trained, and report on the dry run itself says it is one."""
    trained = run_cli(["recipe=quickstart", "smoke=true", "trainer.checkpoint_every=1"], tmp_path)
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    run = (tmp_path / "log_output" / "latest").resolve()
    dry = cli(["recipe=quickstart", "dry_run=true"], tmp_path)
    assert dry.returncode == 0 and (tmp_path / "log_output" / "latest").resolve() != run
    dry_dir = (tmp_path / "log_output" / "latest").resolve()
    report = cli(["report", "log_output/latest"], tmp_path)
    said = " ".join(report.stdout.split())
    assert report.returncode == 0 and f"is a dry run ({dry_dir.name}): taking the newest run that trained" in said
    assert (run / "loss.png").is_file()  # the trained run was reported
    report = cli(["report", str(dry_dir)], tmp_path)
    assert "dry run (dry_run=true wrote this plan: nothing was started or trained)" in " ".join(report.stdout.split())
    resumed = cli(["recipe=quickstart", "smoke=true", "trainer.steps=4", "trainer.resume=latest", "dry_run=true"],
                  tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    plan = json.loads(((tmp_path / "log_output" / "latest").resolve() / "plan.json").read_text())
    assert plan["resume_from"].startswith(str(run / "checkpoints" / "step")), plan["resume_from"]


def test_hydra_s_info_flags_and_shell_completion_work_without_a_recipe(tmp_path):
    """--info, --hydra-help and shell completion (install, and a query as bash asks it) need no recipe= and exit 0."""
    import os

    info = run_cli(["--info"], tmp_path)
    assert info.returncode == 0 and "Installed Hydra Plugins" in info.stdout, info.stdout + info.stderr
    hydra_help = run_cli(["--hydra-help"], tmp_path)
    assert hydra_help.returncode == 0 and "Hydra (" in hydra_help.stdout, hydra_help.stdout + hydra_help.stderr
    install = run_cli(["-sc", "install=bash"], tmp_path)
    assert install.returncode == 0 and "complete -o nospace -o default -F hydra_bash_completion" in install.stdout
    query = subprocess.run([sys.executable, "-m", "launcher.cli", "-sc", "query=bash"], cwd=tmp_path, text=True,
                           capture_output=True, env={**os.environ, "COMP_LINE": "hetero-launch trainer.st"})
    assert query.returncode == 0 and "trainer.steps=" in query.stdout.split(), query.stdout + query.stderr
    assert not list(tmp_path.iterdir())  # nothing written


def test_the_environment_that_chooses_how_ranks_run_is_checked_before_launch(tmp_path):
    """HL_* settings with a value they do not take were read as the default, silently; an HL_CACHE_DIR that cannot be
    made or written failed in the ranks (a traceback building DeepSpeed's ops), or left the host tables on torch's
    ops while the plan said C kernels."""
    import os

    (tmp_path / "file").write_text("x")
    for name, value, said in (("HL_TABLE_KERNELS", "garbage", "HL_TABLE_KERNELS=garbage: not one of auto, torch."),
                              ("HL_TABLE_HUGEPAGES", "maybe", "HL_TABLE_HUGEPAGES=maybe: not one of 0, 1."),
                              ("HL_CACHE_DIR", str(tmp_path / "file"), f"HL_CACHE_DIR={tmp_path / 'file'}: "
                                                                      f"hetero-launch cannot make or write it")):
        res = subprocess.run([sys.executable, "-m", "launcher.cli", "recipe=quickstart", "dry_run=true"],
                             cwd=tmp_path, env={**os.environ, "COLUMNS": "200", name: value}, capture_output=True,
                             text=True, timeout=300)
        out = " ".join((res.stdout + res.stderr).split())
        assert res.returncode == 2 and said in out and "Traceback" not in out, (name, out[-2000:])
    assert not (tmp_path / "log_output").exists()
