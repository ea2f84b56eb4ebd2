"""bench.autoscale_curve's verdicts: where a policy point lies against the fixed-window
curve, and the issue's two named targets."""

from bench.autoscale_curve import Point, curve_wait_at, verdict

CURVE = [Point(100.0, 20.0), Point(200.0, 10.0), Point(300.0, 8.0)]


def test_the_curve_is_interpolated_between_its_two_nearest_windows():
    assert curve_wait_at(CURVE, 150.0) == 15.0
    assert curve_wait_at(CURVE, 250.0) == 9.0
    assert curve_wait_at(CURVE, 200.0) == 10.0


def test_outside_the_windows_range_there_is_no_curve():
    assert curve_wait_at(CURVE, 99.0) is None
    assert curve_wait_at(CURVE, 301.0) is None


def test_a_point_below_the_curve_is_beyond_it_and_one_above_inside():
    assert verdict(Point(150.0, 12.0), CURVE, None, None) == "beyond by 3.00 pts"
    assert verdict(Point(150.0, 16.5), CURVE, None, None) == "inside by 1.50 pts"


def test_the_named_targets_need_strictly_less_of_one_and_no_more_of_the_other():
    at_5s, at_60s = CURVE[0], CURVE[1]
    # Fewer runner-seconds than 60 s at equal waits: beats it; equal runner-seconds: not.
    assert "beats 60 s" in verdict(Point(199.0, 10.0), CURVE, at_5s, at_60s)
    assert "beats 60 s" not in verdict(Point(200.0, 9.0), CURVE, at_5s, at_60s)
    # Fewer waits than 5 s at equal runner-seconds: beats it; more runner-seconds: not.
    assert "beats 5 s" in verdict(Point(100.0, 19.0), CURVE, at_5s, at_60s)
    assert "beats 5 s" not in verdict(Point(101.0, 19.0), CURVE, at_5s, at_60s)
