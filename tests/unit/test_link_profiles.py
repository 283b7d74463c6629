"""envs/link-profiles.sh (run by set-up): the site profiles are linked where `snakemake
--profile <name>` looks for bare names, and a same-named profile of the user's own is
never replaced."""

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "envs" / "link-profiles.sh"
REPO = SCRIPT.parents[1]


def link(tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT)], env={**os.environ, "XDG_CONFIG_HOME": str(tmp_path)},
                          capture_output=True, text=True, check=True)


def test_profiles_are_linked_and_a_users_own_are_left_alone(tmp_path):
    cfg = tmp_path / "snakemake"
    cfg.mkdir()
    (cfg / "local").mkdir()  # the user's own profile folder
    (cfg / "local" / "config.yaml").write_text("cores: 64\n")
    elsewhere = tmp_path / "mine" / "slurm_a800"
    elsewhere.mkdir(parents=True)
    (cfg / "slurm_a800").symlink_to(elsewhere)  # a link of the user's own, elsewhere
    other_clone = tmp_path / "old-clone"
    (other_clone / "workflow" / "scripts" / "llmbench").mkdir(parents=True)
    (other_clone / "profiles" / "slurm_rtx4090").mkdir(parents=True)
    (cfg / "slurm_rtx4090").symlink_to(other_clone / "profiles" / "slurm_rtx4090")  # ours, another checkout
    (cfg / "slurm_rtx3090").symlink_to(tmp_path / "gone" / "profiles" / "slurm_rtx3090")  # ours, dangling

    res = link(tmp_path)

    assert (cfg / "local" / "config.yaml").read_text() == "cores: 64\n" and not (cfg / "local").is_symlink()
    assert os.readlink(cfg / "slurm_a800") == str(elsewhere)
    for name in ("slurm_rtx4090", "slurm_rtx3090", "slurm_ci"):
        assert os.readlink(cfg / name) == str(REPO / "profiles" / name)
    assert not (cfg / "default").exists()
    skipped = [ln for ln in res.stderr.splitlines() if "left as it is" in ln]
    assert len(skipped) == 2 and any("/local " in ln for ln in skipped) and any("/slurm_a800 " in ln for ln in skipped)


def test_linking_twice_changes_nothing(tmp_path):
    link(tmp_path)
    first = {p.name: os.readlink(p) for p in (tmp_path / "snakemake").iterdir()}
    res = link(tmp_path)
    assert {p.name: os.readlink(p) for p in (tmp_path / "snakemake").iterdir()} == first
    assert res.stderr == ""
