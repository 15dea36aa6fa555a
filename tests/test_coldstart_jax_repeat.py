"""The JAX program's cold start with `--repeat 3` (tests/fixtures/coldstart/repeat/jax_repeat3_run1.json.gz,
captured on the H200): read back through the CLI, its causes add up to the excess within 10 % and the rest is
within the rounds' noise; XLA's autotuning and compile are named as the two largest causes, each with its spread
over the three rounds."""
import json
from pathlib import Path

from click.testing import CliRunner

from cublaslt_probe.cli import main

SAVE = Path(__file__).parent / "fixtures" / "coldstart" / "repeat" / "jax_repeat3_run1.json.gz"


def test_the_jax_cold_start_adds_up_within_ten_percent_over_three_rounds(tmp_path):
    out = tmp_path / "jax.json"
    r = CliRunner().invoke(main, ["cold-start", "--from", str(SAVE), "-o", str(out)])
    assert r.exit_code == 0, r.output
    a = json.loads(out.read_text())
    assert a["repeat"] == 3
    total = sum(c["seconds"] for c in a["components"]) + a["unexplained_s"]
    assert abs(total - a["excess_s"]) < 1e-9
    assert abs(a["unexplained_pct"]) < 10 and a["unexplained_within_noise"]
    top = sorted(a["components"], key=lambda c: -c["seconds"])[:2]
    assert [c["cause"] for c in top] == ["xla_autotuning", "xla_compile"], [c["cause"] for c in top]
    for c in top:
        assert len(c["rounds_s"]) == 3 and c["spread"]["min"] <= c["seconds"] <= c["spread"]["max"]
