"""metrics.jsonl and its TensorBoard mirror: the same scalars in both, trial tags apart, and
tensorboardX loaded without torch (3-4 s of every run's start-up when torch is installed)."""
import json
import subprocess
import sys
import textwrap

WRITE = textwrap.dedent("""
    import json, struct, sys
    from pathlib import Path
    from jaxdepth.trainer.metrics import MetricsWriter
    w = MetricsWriter(Path(sys.argv[1]))
    w.write(1, loss=2.5, lr=0.125)
    w.write(2, trial=3, loss=1.25)
    w.write(3, trial=2, loss=0.5, param_norm=float("inf"), frozen=1.0)  # a trial freezing
    w.close()
    loaded = "torch" in sys.modules and sys.modules["torch"] is not None
    # the scalars of the TensorBoard event file (TFRecord framing: length, its CRC, the
    # record, its CRC), read back here, where tensorboardX is loaded already
    from tensorboardX.proto.event_pb2 import Event
    (path,) = (Path(sys.argv[1]) / "tb").iterdir()
    data, i, scalars = path.read_bytes(), 0, []
    while i < len(data):
        (n,) = struct.unpack("<Q", data[i:i + 8])
        event = Event.FromString(data[i + 12:i + 12 + n])
        i += 12 + n + 4
        scalars += [[v.tag, event.step, v.simple_value] for v in event.summary.value]
    print(json.dumps({"torch_loaded": loaded, "scalars": sorted(scalars)}))
""")


def test_scalars_reach_both_files_and_torch_stays_unloaded(tmp_path):
    res = subprocess.run([sys.executable, "-c", WRITE, str(tmp_path)], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    got = json.loads(res.stdout)
    assert got["torch_loaded"] is False  # torch was not imported, installed or not
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert records == [{"step": 1, "loss": 2.5, "lr": 0.125},
                       {"step": 2, "trial": 3, "loss": 1.25},
                       {"step": 3, "trial": 2, "loss": 0.5, "param_norm": float("inf"),
                        "frozen": 1.0}]
    # a non-finite value stays in metrics.jsonl only: tensorboardX would warn of each one
    assert got["scalars"] == [["loss", 1, 2.5], ["lr", 1, 0.125], ["trial_2/frozen", 3, 1.0],
                              ["trial_2/loss", 3, 0.5], ["trial_3/loss", 2, 1.25]]
    assert "NaN or Inf" not in res.stderr, res.stderr[-2000:]
