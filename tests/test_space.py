"""The whole-space search's CPU rules (`analysis.space`): screening order, pruning, the trust model of a regret."""
import pytest

from cublaslt_probe.analysis import space as sm


def test_wave_efficiency_counts_the_last_wave():
    # 4096x16 output (decode, cuBLAS view): 64x16 tiles make 64 CTAs on 132 SMs: one partial wave
    assert sm.wave_efficiency("64x16", "1x1x1", 4096, 16) == pytest.approx(64 / 132)
    # 128x128 on 4096x4096: 1024 CTAs = 7.76 waves -> 1024 / (8 * 132)
    assert sm.wave_efficiency("128x128", None, 4096, 4096) == pytest.approx(1024 / 1056)
    # a 2x1 cluster rounds the grid's M up to even: 33 -> 34 tile rows
    assert sm.wave_efficiency("128x128", "2x1x1", 33 * 128, 128, sms=1000) == pytest.approx(34 / 1000)
    assert sm.wave_efficiency("UNDEFINED", None, 64, 64) == 0.5


def test_screen_order_interleaves_algos_and_puts_full_waves_first():
    ks = [{"algo_id": 66, "tile": "64x16", "cluster": "1x1x1"},     # 64 CTAs on 4096x16
          {"algo_id": 66, "tile": "32x16", "cluster": "1x1x1"},     # 128 CTAs: better filled
          {"algo_id": 31, "tile": "128x128", "cluster": None},
          {"algo_id": 66, "tile": "16x16", "cluster": "1x1x1"},     # 256 CTAs: 2 waves, 97 %
          {"algo_id": 31, "tile": "64x64", "cluster": None}]
    order = sm.screen_order(ks, 4096, 16)
    assert sorted(order) == list(range(len(ks)))
    # algo 66 first, then the algos alternate
    assert [ks[i]["algo_id"] for i in order] == [66, 31, 66, 31, 66]
    assert [ks[i]["tile"] for i in order if ks[i]["algo_id"] == 66] == ["32x16", "16x16", "64x16"]


def test_prunes_only_far_behind_an_existing_best():
    assert not sm.prunes(100.0, None)
    assert not sm.prunes(12.0, 10.0)              # 1.25 x 10 + 1 = 13.5
    assert sm.prunes(13.6, 10.0)
    assert not sm.prunes(13.6, 10.0, ratio=1.5)


def _rounds(pick, pick2, best, n=5):
    return [{"pick": p, "pick#2": q, "space_1": b} for p, q, b in zip(pick, pick2, best)][:n]


def test_trust_a_clear_loss():
    r = sm.trust(_rounds([10.0, 10.1, 10.0, 10.05, 10.0], [10.02, 10.0, 10.03, 10.0, 10.01],
                         [8.0, 8.1, 8.0, 8.05, 8.0]), "pick", ["space_1"])
    assert r["winner"] == "space_1" and r["label"] == "loss"
    assert r["regret_pct"] == pytest.approx(25.0, abs=0.5)
    assert r["flip_rate"] == 0.0
    assert 0.5 <= r["noise_pct"] < 1.5


def test_trust_a_regret_within_the_pick_s_own_noise_is_no_loss():
    # the best is 1 % faster in its median, but the pick differs from itself by 3 % in one round
    r = sm.trust(_rounds([10.0, 10.0, 10.0, 10.0, 10.0], [10.3, 10.0, 10.0, 10.0, 10.0],
                         [9.9, 9.9, 9.9, 9.9, 9.9]), "pick", ["space_1"])
    assert r["winner"] == "space_1"
    assert r["regret_pct"] == pytest.approx(1.0, abs=0.05)
    assert r["noise_pct"] == pytest.approx(100 * (1 - 10 / 10.3), abs=0.01)
    assert r["label"] == "within noise"


def test_trust_a_winner_that_flips_is_no_loss():
    # faster in the median by 5 %, yet slower than the pick in two rounds of five
    r = sm.trust(_rounds([10.0] * 5, [10.0] * 5, [9.5, 9.5, 9.5, 10.5, 10.5]), "pick", ["space_1"])
    assert r["winner"] == "space_1" and r["flip_rate"] == pytest.approx(0.4)
    assert r["label"] == "within noise"


def test_trust_finalists_trading_places_do_not_make_a_loss_noise():
    # two alternatives 10 % faster than the pick in every round, each the fastest in turn
    rounds = [{"pick": 10.0, "pick#2": 10.05, "space_1": 9.0 + d, "space_2": 9.05 - d} for d in (0, .1, 0, .1, 0)]
    r = sm.trust(rounds, "pick", ["space_1", "space_2"])
    assert r["leader_changes"] == pytest.approx(0.4) and r["flip_rate"] == 0.0
    assert r["label"] == "loss" and r["regret_pct"] > 9


def test_trust_pick_is_best_and_a_wrong_pick_never_wins():
    rounds = _rounds([9.0] * 5, [9.0] * 5, [10.0] * 5)
    assert sm.trust(rounds, "pick", ["space_1"])["label"] == "pick is best"
    wrong = sm.trust(rounds, "pick", ["space_1"], pick_ok=False)
    assert wrong["winner"] == "space_1" and wrong["regret_pct"] < 0 and wrong["label"] == "within noise"


def test_trust_without_rounds():
    assert sm.trust([], "pick", ["space_1"])["label"] is None


def test_columns_of_no_space_are_null():
    assert set(sm.columns(None)) == set(sm.SCHEMA)
    assert all(v is None for v in sm.columns({"error": "x"}).values())


@pytest.mark.parametrize("m,n,k,cls", [(1, 4096, 4096, "decode square"), (128, 14336, 4096, "small up"),
                                       (4096, 4096, 14336, "large down"), (1024, 6144, 4096, "mid up")])
def test_shape_class(m, n, k, cls):
    assert sm.shape_class(m, n, k) == cls


@pytest.mark.parametrize("m,cls", [(1, "decode"), (16, "decode"), (17, "small"), (256, "small"), (257, "mid"),
                                   (2048, "mid"), (2049, "large"), (16384, "large")])
def test_token_class_bounds(m, cls):
    assert sm.token_class(m) == cls and sm.shape_class(m, 4096, 4096) == f"{cls} square"


def test_token_range_names_each_class_s_m():
    assert [sm.token_range(c) for c, _ in sm.TOKEN_CLASSES] == ["m ≤ 16", "17–256", "257–2048", "m > 2048"]
    with pytest.raises(ValueError, match="unknown token class"):
        sm.token_range("prefill")


def test_space_options_are_checked_before_any_gpu_work(tmp_path):
    from click.testing import CliRunner

    from cublaslt_probe.cli import main
    r = CliRunner().invoke(main, ["sweep", "--preset", "llm", "--backends", "lt", "--space", "-1",
                                  "-o", str(tmp_path / "x.parquet")])
    assert r.exit_code == 2 and "--space" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(main, ["candidates", "--m", "16", "--n", "4096", "--k", "4096", "--space", "0"])
    assert r.exit_code == 2 and "--space" in r.output
    r = CliRunner().invoke(main, ["sweep", "--preset", "llm", "--backends", "lt", "--space", "0.5", "--dry-run",
                                  "-o", str(tmp_path / "x.parquet")])
    assert r.exit_code == 0, r.output


def test_probe_option_space_s_is_checked():
    from cublaslt_probe.errors import OptionError
    from cublaslt_probe.gpu.probe import ProbeOptions
    assert ProbeOptions(space_s=1.5).space_s == 1.5
    for bad in (-1.0, True, "2"):
        with pytest.raises(OptionError, match="space_s"):
            ProbeOptions(space_s=bad)
