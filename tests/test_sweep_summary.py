"""The sweep's closing line reads as the GEMMs' own rate when the probe paid set-ups inside the run, and the
probe's start-up record tells those set-ups from `Probe()`'s own (`StartUp.mark_started`)."""
from cublaslt_probe.cli.sweep import ran_line
from cublaslt_probe.gpu.probe import StartUp


def test_first_use_phases_are_those_after_the_probe_started():
    st = StartUp()
    with st("CUDA device"):
        pass
    st.mark_started()
    with st("operand pool bf16 (first needed)"):
        pass
    with st("operand pool bf16 (first needed)"):
        pass
    assert list(st.on_first_use()) == ["operand pool bf16 (first needed)"]
    assert set(st.seconds()) == {"CUDA device", "operand pool bf16 (first needed)"}
    assert StartUp().on_first_use() == {}


def test_a_small_sweeps_rate_is_given_without_the_set_ups_it_paid_on_first_use():
    line = ran_line(198, 5.24, 0.15, {"CUPTI started (first kernel capture)": 3.0,
                                      "operand pool bf16 (first needed)": 0.4, "spin calibration (first needed)": 0.1})
    assert line.startswith("ran 198 GEMMs in 5.24 s (37.8 GEMMs/s), 3.50 s of it set-ups paid on first use "
                           "(CUPTI started 3.00 s, operand pool bf16 0.40 s): 113.8 GEMMs/s without")
    assert line.endswith("then built the dataset in 0.15 s")


def test_a_sweep_that_paid_nothing_on_first_use_says_only_its_rate():
    assert ran_line(4672, 6.4, 1.2, {}) == "ran 4672 GEMMs in 6.40 s (730.0 GEMMs/s), then built the dataset in 1.20 s"
    assert "first use" not in ran_line(4672, 6.4, 1.2, {"gap calibration (first needed)": 0.01})
