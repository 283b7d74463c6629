"""envs/wheelhouse.sh (offline GPU nodes) pins what envs/requirements.txt pins: the
reference runs ran from it, so a version bumped in one file only would make them run
another stack than the one CI tests. Its FIGURES=1 part carries the figure rule's closure."""

import re


def _pins(text: str) -> dict[str, str]:
    return {m[0].lower().replace("_", "-"): m[1] for m in re.findall(r"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==([^\s;#]+)", text)}


def test_wheelhouse_pins_agree_with_the_requirements(repo):
    script = (repo / "envs/wheelhouse.sh").read_text()
    wheel, req = _pins(script), _pins((repo / "envs/requirements.txt").read_text())
    shared = set(wheel) & set(req)
    assert {"snakemake", "deepspeed", "bitsandbytes", "megatron-core", "altair", "vl-convert-python"} <= shared
    assert {k: wheel[k] for k in shared} == {k: req[k] for k in shared}
    figures = script.split('if [[ "${FIGURES:-0}" == 1 ]]; then', 1)[1].split("fi\n", 1)[0]
    assert {"altair", "vl-convert-python"} <= set(_pins(figures))
