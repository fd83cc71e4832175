"""python -m jaxdepth.experiments.table2: the DWAtt paper's Table 2 for a backbone given by
its sizes, against counts written out by hand."""
from jaxdepth.experiments import table2


def test_table2_counts_what_each_method_adds(capsys):
    assert table2.main(["--layers", "2", "--d-model", "32", "--heads", "2", "--vocab", "64"]) == 0
    rows = {line.split("|")[1].strip(): int(line.split("|")[2].replace(",", ""))
            for line in capsys.readouterr().out.splitlines()
            if line.startswith("| ") and not line.startswith("| method")}
    L, d = 2, 32
    assert rows["base"] == 0
    assert rows["scalar_mix"] == L + 1  # s [L] and gamma
    assert rows["concat"] == L * d * d + d  # one [L*d, d] projection and its bias
    assert rows["dwatt"] > rows["concat"] > rows["scalar_mix"]


def test_table2_names_a_bad_backbone_in_one_line(capsys, tmp_path):
    assert table2.main(["--backbone", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nowhere" in err[0]
