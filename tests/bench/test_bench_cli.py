"""``python -m bench`` and ``python -m bench.endtoend`` take a comma list of generators, and the
growth exponent fits time against guests (no benchmark is run here)."""

from __future__ import annotations

import pytest
from bench.clusters import EARLIER, GENERATORS, REALISTIC, generator_names
from bench.endtoend_report import exponent

from bench import __main__ as bench_main
from bench import endtoend


def test_a_comma_list_of_generators_keeps_its_order_and_drops_repeats() -> None:
    assert generator_names("basic,skewed,new-node,hot-rack,mixed") == list(GENERATORS)
    assert generator_names("mixed, basic") == ["mixed", "basic"]
    assert generator_names("new-node,both,basic") == ["new-node", *EARLIER]


def test_both_means_the_earlier_two_and_all_means_every_generator() -> None:
    assert generator_names("both") == ["basic", "skewed"]
    assert generator_names("all") == [*EARLIER, *REALISTIC]
    assert set(REALISTIC) == {"new-node", "hot-rack", "mixed"}


@pytest.mark.parametrize("text", ["nope", "basic,nope", "", " , "])
def test_an_unknown_or_empty_generator_list_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        generator_names(text)


def test_the_bench_parser_defaults_to_every_generator() -> None:
    args = bench_main.build_parser().parse_args([])
    assert generator_names(args.generator) == list(GENERATORS)
    assert args.yardstick and args.growth
    args = bench_main.build_parser().parse_args(["--generator", "basic,new-node", "--no-growth"])
    assert generator_names(args.generator) == ["basic", "new-node"]
    assert not args.growth


@pytest.mark.parametrize("main", [bench_main.main, endtoend.main], ids=["bench", "bench.endtoend"])
def test_an_unknown_generator_is_one_line_and_exit_2(
    main: object, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--generator", "basic,nope"])  # type: ignore[operator]
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "unknown generator 'nope'" in err


def test_the_growth_exponent_is_the_slope_in_log_log() -> None:
    assert exponent([(1_000, 1.0), (10_000, 10.0), (100_000, 100.0)]) == pytest.approx(1.0)
    assert exponent([(1_000, 2.0), (10_000, 200.0)]) == pytest.approx(2.0)
    assert exponent([(1_000, 2.0), (1_000, 3.0)]) is None


def test_size_lists_are_checked_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    parser = bench_main.build_parser()
    assert bench_main._sizes(parser, "--growth-sizes", "S, XXL") == ["S", "XXL"]
    with pytest.raises(SystemExit) as exited:
        bench_main.main(["--growth-sizes", "S,XXXL"])
    assert exited.value.code == 2
    assert "--growth-sizes: unknown size 'XXXL'" in capsys.readouterr().err


def test_the_growth_command_fits_each_series_and_from_l_up() -> None:
    from bench.growth import fitted

    sizes = [("S", 200, 0.5), ("M", 1_000, 0.6), ("L", 3_000, 0.9), ("XL", 20_000, 4.0)]
    rows = [{"size": s, "guests": g, "cpu_s": t, "wall_s": 2 * t} for s, g, t in sizes]
    found = fitted(rows)
    assert found["cpu_s"] == found["wall_s"] == round(exponent([(g, t) for _s, g, t in sizes]), 2)
    assert found["cpu_s_from_L"] == round(exponent([(3_000, 0.9), (20_000, 4.0)]), 2)
    assert fitted(rows[:1]) == {} and "cpu_s_from_L" not in fitted(rows[2:])
