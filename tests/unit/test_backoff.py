from ebb.backoff import delay_s, jittered


def test_the_wait_doubles_from_the_first_and_stops_at_the_cap():
    waits = [delay_s(n, first_s=0.5, cap_s=3.0) for n in range(0, 6)]
    assert waits == [0.0, 0.5, 1.0, 2.0, 3.0, 3.0]


def test_a_long_run_of_failures_stays_at_the_cap():
    assert delay_s(10_000, first_s=1.0, cap_s=60.0) == 60.0


def test_jitter_keeps_the_wait_within_its_upper_half():
    spread = [jittered(2.0) for _ in range(200)]
    assert all(1.0 <= w <= 2.0 for w in spread)
    assert len(set(spread)) > 1
