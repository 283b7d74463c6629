import pytest

from llmbench.techniques import Technique, TechniqueError, canonical, parse


@pytest.mark.parametrize(
    "text,flags",
    [
        ("Naive", dict()),
        ("naive", dict()),
        ("Z2", dict(zero_stage=2)),
        ("Z3+O", dict(zero_stage=3, offload=True)),
        ("F+R+Z3+O", dict(zero_stage=3, offload=True, recompute=True, flash=True)),
        ("R+Q", dict(recompute=True, quant4=True)),
        ("O+Z2+F", dict(zero_stage=2, offload=True, flash=True)),
    ],
)
def test_parse_flags(text, flags):
    assert parse(text) == Technique(**flags)


def test_order_insensitive_and_canonical():
    assert canonical("O+Z3+R+F") == canonical("F+R+Z3+O") == "F+R+Z3+O"
    assert canonical("Q+R") == "R+Q"
    assert canonical("naive") == "Naive"
    assert canonical("C+Z2+R+F") == "F+R+Z2+C" and canonical("C+QL") == "QL+C"
    # canonical names parse back to themselves
    for name in ["Naive", "Z2+O", "F+R+Z2+O", "R+Q", "F+Z3", "F+R+Z2+C", "Q+C", "L+R+C"]:
        assert parse(name).name == name


@pytest.mark.parametrize(
    "text,needle",
    [
        ("Z2+Z3", "both Z2 and Z3"),
        ("O", "needs Z2 or Z3"),
        ("R+O", "needs Z2 or Z3"),
        ("Z4", "unknown flag 'Z4'"),
        ("F+F", "repeated"),
        ("F+", "unknown flag ''"),
        ("", "non-empty"),
    ],
)
def test_rejects(text, needle):
    with pytest.raises(TechniqueError, match=needle):
        parse(text)


def test_unknown_flag_lists_allowed():
    with pytest.raises(TechniqueError) as exc:
        parse("X")
    for flag in ("F", "R", "Z2", "Z3", "O", "Q", "C", "Naive"):
        assert flag in str(exc.value)


def test_dataclass_rejects_offload_without_zero():
    with pytest.raises(TechniqueError):
        Technique(offload=True)


@pytest.mark.parametrize(
    "text,canon,adapter,quant4",
    [
        ("L", "L", "lora", False),
        ("QL", "QL", "lora", True),
        ("Q+L", "QL", "lora", True),  # QLoRA is LoRA on a 4-bit base
        ("R+F+QL", "QL+F+R", "lora", True),
        ("L+F+R+Z3+O", "L+F+R+Z3+O", "lora", False),
        ("lfa+R", "LFA+R", "lora_fa", False),
        ("DoRA+Z2", "DORA+Z2", "dora", False),
        ("PT", "PT", "prompt_tuning", False),
    ],
)
def test_fine_tuning_methods(text, canon, adapter, quant4):
    t = parse(text)
    assert (t.name, t.adapter, t.quant4) == (canon, adapter, quant4)
    assert parse(t.name) == t


def test_two_fine_tuning_methods_rejected():
    with pytest.raises(TechniqueError, match="several fine-tuning methods"):
        parse("L+PT")
